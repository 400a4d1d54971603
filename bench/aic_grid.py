"""Print the roofline-vs-aiconfigurator grid table of docs/timing.md (kernel time, host overhead excluded).

    python bench/aic_grid.py                 # Llama-3.1-8B and Qwen3-32B, TP1
    python bench/aic_grid.py --tp 2
    python bench/aic_grid.py --model Qwen/Qwen3-8B

Needs the aic extra (pip install -e '.[aic]').
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay.engine.hardware import get_hardware  # noqa: E402
from replay.engine.models import get_model  # noqa: E402
from replay.engine.timing.aic import AicTimer  # noqa: E402
from replay.engine.timing.grid import compare, grid  # noqa: E402
from replay.engine.timing.roofline import RooflineTimer  # noqa: E402


def table(model_name: str, tp: int, hardware: str) -> tuple[str, float, float]:
    spec, hw = get_model(model_name), get_hardware(hardware)
    roof = RooflineTimer(spec, hw, tp=tp)
    aic = AicTimer(spec, hw, tp=tp, host_overhead_ms=0.0)
    rows = compare(roof, aic, grid(roof.kv_bytes_per_token))
    errs = [abs(e) for *_, e in rows]
    mape, worst = sum(errs) / len(errs), max(errs)
    lines = [f"#### {spec.name}, {hw.name}, TP{tp}: MAPE {mape:.1%}, max {worst:.1%} over {len(rows)} steps", "",
             "| step | roofline ms | aiconfigurator ms | error |", "|---|---:|---:|---:|"]
    for pt, r, a, e in rows:
        lines.append(f"| {pt.label} | {r:.2f} | {a:.2f} | {e:+.1%} |")
    return "\n".join(lines) + "\n", mape, worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="repeatable; default Llama-3.1-8B and Qwen3-32B")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--hardware", default="h200_sxm")
    args = ap.parse_args()
    for name in args.model or ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B"]:
        text, _, _ = table(name, args.tp, args.hardware)
        print(text)


if __name__ == "__main__":
    main()
