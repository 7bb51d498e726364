"""Rollouts: the RolloutBatch / RolloutEngine seam (base) and the Hugging Face backend (hf)."""
