"""Differential test of replay's scheduler against vLLM 0.33's own (see bench/README.md)."""
