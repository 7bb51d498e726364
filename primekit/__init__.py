"""primekit: online RL with implicit process rewards (PRIME) and explicit-PRM refinements."""

__version__ = "0.1.0"
