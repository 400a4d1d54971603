"""Side-by-side harness: replay against NVIDIA AISimulate on the same trace and settings.

Run ``python -m bench.compare --help`` from the repository root; see docs/fidelity.md.
"""
