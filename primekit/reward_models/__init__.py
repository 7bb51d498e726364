"""Explicit reward models (Gao et al. 2024): ORM and step-level PRM, their dense rewards in RL,
and the synthetic repetition check. Step segmentation and the reward-hacking diagnostics are
pure functions in primekit.algorithms (segmentation, hacking).

Modules (import what you need; nothing heavy is imported here):
  heads         LM + scalar head (AutoModelForTokenClassification, 1 label): load, score, fit
  labeling      sampled responses, verifier labels, Math-Shepherd Monte-Carlo step labels
  orm, prm      losses and the `train-orm` / `train-prm` commands
  dense         ExplicitRewarder: frozen ORM/PRM -> token rewards, with Clip/Delta/... refinements
  hack_check    the synthetic repetition check (`primekit hack-check`)
  cli           add_subcommands / dispatch for primekit.cli
See docs/explicit_rewards.md.
"""
