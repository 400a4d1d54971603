"""The comparison grid of docs/timing.md: roofline against aiconfigurator-core on one set of steps.

Shared by the accuracy test (tests/engine/test_timing_aic.py) and the table generator (bench/aic_grid.py), so
the documented numbers and the checked numbers come from the same steps.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from replay.engine.timing.base import StepShape, shape_from_requests

DECODE_BATCHES = (1, 4, 16, 64, 128, 256)
DECODE_CONTEXTS = (512, 2048, 8192, 32768)
PREFILL_LENGTHS = (256, 1024, 4096, 16384)
CACHED_CHUNKS = ((512, 2048), (2048, 2048), (2048, 6144), (2048, 14336), (4096, 12288), (8192, 8192))
MIXED = ((256, 31, 2048), (1024, 63, 2048), (2048, 32, 8192), (512, 127, 1024), (4096, 16, 4096),
         (1024, 255, 512))
MAX_KV_BYTES = 120e9  # skip decode points whose KV alone would not fit in an H200 at TP1
# Large decode batches over long contexts whose KV would not fit unshared, but which requests that
# share a prefix reach (each request's attention streams its whole context, shared blocks included):
# an overloaded replica of reuse-heavy traffic runs 256 requests at about 10k tokens each.
SHARED_PREFIX_DECODES = ((128, 8192), (256, 8192), (256, 16384))


@dataclass(frozen=True)
class GridPoint:
    label: str
    kind: str   # decode | prefill | cached | mixed
    shape: StepShape


def grid(kv_bytes_per_token: int) -> list[GridPoint]:
    """Decode batch 1-256 x context 512-32k (points whose KV fits, and three large batches over long
    contexts that only shared prefixes make reachable), prefill 256-16k without and with cached
    prefixes, and mixed steps (one prefill chunk plus a decode batch)."""
    pts: list[GridPoint] = []
    for b in DECODE_BATCHES:
        for c in DECODE_CONTEXTS:
            if b * c * kv_bytes_per_token <= MAX_KV_BYTES:
                pts.append(GridPoint(f"decode {b} x {c}", "decode", shape_from_requests(decodes=[c] * b)))
    for b, c in SHARED_PREFIX_DECODES:
        if b * c * kv_bytes_per_token > MAX_KV_BYTES:
            pts.append(GridPoint(f"decode {b} x {c} (shared prefixes)", "decode",
                                 shape_from_requests(decodes=[c] * b)))
    for n in PREFILL_LENGTHS:
        pts.append(GridPoint(f"prefill {n}", "prefill", shape_from_requests(prefills=[(n, 0)])))
    for n, p in CACHED_CHUNKS:
        pts.append(GridPoint(f"chunk {n} over {p} cached", "cached", shape_from_requests(prefills=[(n, p)])))
    for n, b, c in MIXED:
        pts.append(GridPoint(f"{n} prefill + {b} decodes at {c}", "mixed",
                             shape_from_requests(prefills=[(n, 0)], decodes=[c] * b)))
    return pts


def kernel_ms(timer, shape: StepShape) -> float:
    """GPU time of a step (host overhead removed) from any StepTimer."""
    return timer.step_ms(*astuple(shape)) - timer.host_overhead_ms


def compare(roofline, aic, points: list[GridPoint]) -> list[tuple[GridPoint, float, float, float]]:
    """(point, roofline ms, aic ms, signed relative error of the roofline) for each point."""
    rows = []
    for pt in points:
        r, a = kernel_ms(roofline, pt.shape), kernel_ms(aic, pt.shape)
        rows.append((pt, r, a, (r - a) / a))
    return rows
