"""Models: HF loading/saving (hf), per-token log-probs (logprobs), the embedded tiny model (tiny)."""
