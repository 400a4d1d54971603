"""The product's version, recorded in every output (run.json, canonical traces, sweep stores)."""

__version__ = "0.1.0"
