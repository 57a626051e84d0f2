"""Attention over packed prefill/decode rows with a paged KV cache."""
