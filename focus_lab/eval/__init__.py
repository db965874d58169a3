"""Evaluation: perplexity per pattern, the passkey probe, baseline routers. Imports method/, hf/ and train/."""
