"""The tiny CPU setup: a character-level Qwen3 policy, an arithmetic task, and its warm start."""
