"""Explicit reward models (Gao et al. 2024): ORM and step-level PRM, their dense rewards in RL,
reward-hacking diagnostics and the synthetic repetition check.

Modules (import what you need; nothing heavy is imported here):
  segmentation  steps of a response and the token each one ends on
  heads         LM + scalar head (AutoModelForTokenClassification, 1 label): load, score, fit
  labeling      sampled responses, verifier labels, Math-Shepherd Monte-Carlo step labels
  orm, prm      losses and the `train-orm` / `train-prm` commands
  dense         ExplicitRewarder: frozen ORM/PRM -> token rewards, with Clip/Delta/... refinements
  diagnostics   reward_hacking_metrics (hack/...), logged every RL step for every reward mode
  hack_check    the synthetic repetition check (`primekit hack-check`)
  cli           add_subcommands / dispatch for primekit.cli
See docs/explicit_rewards.md.
"""
