"""Cost of one StepTimer.step_ms call (the engine calls it once per step, hundreds of thousands of times).

    python bench/bench_steptime.py [--calls 200000] [--trajectory 200000]

Reports ns per call for the roofline (dense; MoE at TP2; DeepSeek-V3 MLA+MoE with MTP drafting), the
aiconfigurator backend on memoized shapes (if installed), and a trivial baseline: a Python method
with the same eight positional arguments that returns a constant, measured in the same run. The
ratio to that baseline is the machine-independent figure; the target is under 5 us per call.

A second table prices a decode trajectory whose shapes never repeat (every request gains a token per
step, requests join and leave), the way a replay calls the timer: one pass on a fresh timer, so the
aiconfigurator fast path pays for fitting its tables and ``timing.aic_exact`` for one direct call per
step.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import astuple
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay.engine.hardware import get_hardware  # noqa: E402
from replay.engine.models import get_model  # noqa: E402
from replay.engine.timing.base import shape_from_requests  # noqa: E402
from replay.engine.timing.roofline import RooflineTimer  # noqa: E402


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


def decode_trajectory(steps: int, seed: int = 0) -> list[tuple]:
    """Decode-only steps of a batch of 1-64 requests (contexts 500-40k) that each gain a token per step;
    every 40 steps one request leaves and/or one joins."""
    rng = random.Random(seed)
    ctx = [rng.randint(500, 20000) for _ in range(16)]
    out = []
    for step in range(steps):
        if step % 40 == 0:
            if len(ctx) > 1 and rng.random() < 0.5:
                ctx.pop(rng.randrange(len(ctx)))
            if len(ctx) < 64 and rng.random() < 0.5:
                ctx.append(rng.randint(500, 40000))
        out.append(astuple(shape_from_requests([], ctx)))
        ctx = [c + 1 for c in ctx]
    return out


def one_pass_ns(timer, shape_list: list[tuple]) -> float:
    fn = timer.step_ms
    t0 = time.perf_counter()
    for s in shape_list:
        fn(*s)
    return (time.perf_counter() - t0) / len(shape_list) * 1e9


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
    ap.add_argument("--trajectory", type=int, default=200_000, help="decode steps in the trajectory table")
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
        from replay.engine.timing.aic import AicTimer
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

    traj = decode_trajectory(args.trajectory)
    llama = get_model("meta-llama/Llama-3.1-8B")
    fresh = [("roofline Llama-3.1-8B TP1", lambda: RooflineTimer(llama, hw), traj)]
    try:
        from replay.engine.timing.aic import AicTimer
        AicTimer(llama, hw, host_overhead_ms=1.0).step_ms(0, 0, 0, 0, 1, 1, 1000, 0)  # load its data, untimed
        fresh += [("aic Llama-3.1-8B (fast path)", lambda: AicTimer(llama, hw, host_overhead_ms=1.0), traj),
                  ("aic Llama-3.1-8B (timing.aic_exact)",
                   lambda: AicTimer(llama, hw, host_overhead_ms=1.0, exact=True), traj[:args.trajectory // 10])]
    except Exception:  # aic extra absent (reported above)
        pass
    print(f"\ndecode trajectory, {len(set(traj))} distinct of {len(traj)} steps, one pass on a fresh timer:")
    print(f"{'case':48s} {'ns/call':>9s} {'x baseline':>10s}")
    for label, make, sl in fresh:
        ns = one_pass_ns(make(), sl)
        print(f"{label:48s} {ns:9.0f} {ns / base:10.1f}")


if __name__ == "__main__":
    main()
