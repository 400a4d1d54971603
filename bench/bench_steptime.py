"""Cost of one StepTimer.step_ms call (the engine calls it once per step, hundreds of thousands of times).

    python bench/bench_steptime.py [--calls 200000]

Reports ns per call for the roofline (dense; MoE at TP2; DeepSeek-V3 MLA+MoE with MTP drafting), the
aiconfigurator backend on memoized shapes (if installed), and a trivial baseline: a Python method
with the same eight positional arguments that returns a constant, measured in the same run. The
ratio to that baseline is the machine-independent figure; the target is under 5 us per call.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import astuple
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.hardware import get_hardware  # noqa: E402
from engine.models import get_model  # noqa: E402
from engine.timing.base import shape_from_requests  # noqa: E402
from engine.timing.roofline import RooflineTimer  # noqa: E402


class Baseline:
    host_overhead_ms = 1.0

    def step_ms(self, a, b, c, d, e, f, g, h):  # noqa: ANN001
        return 1.0


def shapes(n: int, drafts: int) -> list[tuple]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        pre = [(rng.randint(1, 2048), rng.randint(0, 8192)) for _ in range(rng.randint(0, 2))]
        dec = [rng.randint(100, 8000) for _ in range(rng.randint(1, 128))]
        out.append(astuple(shape_from_requests(pre, dec, drafts=drafts)))
    return out


def per_call_ns(timer, shape_list: list[tuple], calls: int) -> float:
    fn = timer.step_ms
    reps = max(1, calls // len(shape_list))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            for s in shape_list:
                fn(*s)
        best = min(best, time.perf_counter() - t0)
    return best / (reps * len(shape_list)) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args()
    hw = get_hardware("h200_sxm")
    plain, spec = shapes(1000, 0), shapes(1000, 2)
    cases = [
        ("baseline (8-arg method returning a constant)", Baseline(), plain),
        ("roofline Llama-3.1-8B TP1", RooflineTimer(get_model("meta-llama/Llama-3.1-8B"), hw), plain),
        ("roofline Qwen3-30B-A3B (MoE) TP2", RooflineTimer(get_model("Qwen/Qwen3-30B-A3B"), hw, tp=2), plain),
        ("roofline DeepSeek-V3 TP8 fp8 + MTP k=2",
         RooflineTimer(get_model("deepseek-ai/DeepSeek-V3"), hw, tp=8, dtype="fp8", drafter="model"), spec),
    ]
    try:
        from engine.timing.aic import AicTimer
        aic = AicTimer(get_model("meta-llama/Llama-3.1-8B"), hw, host_overhead_ms=1.0)
        for s in plain:
            aic.step_ms(*s)  # warm the memo: the engine revisits shapes
        cases.append(("aic Llama-3.1-8B (memoized shapes)", aic, plain))
    except Exception as exc:  # aic extra absent
        print(f"(aic backend skipped: {exc})")
    base = None
    print(f"{'case':48s} {'ns/call':>9s} {'x baseline':>10s}")
    for label, timer, sl in cases:
        ns = per_call_ns(timer, sl, args.calls)
        base = base or ns
        print(f"{label:48s} {ns:9.0f} {ns / base:10.1f}")


if __name__ == "__main__":
    main()
