"""Builders for tiny, offline LLaDA2-style checkpoints (tokenizer, config, weights)."""
