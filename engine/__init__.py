"""The replay engine: a fleet of vLLM V1 engine replicas on one simulated clock."""

from replay.engine import native  # noqa: F401  (first: decides compiled or source modules before any import)
