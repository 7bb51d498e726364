"""Outcome verifiers: every one returns a `Verdict`."""

from primekit.verifiers.base import Verdict, Verifier

__all__ = ["Verdict", "Verifier"]
