"""Calibration by load level on a log with known constants: fit on the lightest level, judge the rest.

    python bench/calibration_levels.py [--requests 120] [--levels 4,1,0.5,0.3] [--budget 128]
        [--max-evaluations 80] [--no-server-phases] [--fit-levels 4,0.5] [--pin-host-ms 3]

No public per-request measurements with load levels exist in the repository or the shared traces, so
this builds one whose true step-time constants are known: the first ``--requests`` requests of the
bundled sample, replayed once per load level (the sample's inter-arrival gaps scaled by each factor,
the levels one after another with a quiet minute between), under a "server" whose constants differ
from the defaults (eta_compute x0.6, eta_memory x0.8, host overhead 3 ms, mixed-step term 20 us per
layer, 128-token budget). Its per-request TTFT, TPOT, E2E and server-side prefill and decode times
are the measurements, each labelled ``source_run`` with its level. The same log is then replayed
with the defaults, and ``calibrate_from_requests`` fits on the lightest level only. Printed: the
fitted parameters with their bounds, and per level the TTFT / E2E MAPE and the error of the mean
TTFT / E2E before and after. The fit sees only what a real log gives (latencies per request); the
model family is the same as the truth's, so this measures identifiability and transfer across
load, not how well the roofline matches a real GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "mooncake_sessions.jsonl"
BUDGET_TOKENS = 128  # a small token budget: prefills run as many chunks, where the mixed-step term shows
TRUTH = {"eta_compute": 0.6, "eta_memory": 0.8}  # factors on the hardware profile's values
TRUTH_HOST_MS = 3.0
TRUTH_MIXED_US = 20.0


def level_log(folder: Path, requests: int, factors: list[float]) -> Path:
    """A JSONL log in the sample's format: each level the same requests with gaps x factor, renamed."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:requests]]
    t0 = rows[0]["timestamp"]
    out, start = [], 0.0
    for level, factor in enumerate(factors):
        for r in rows:
            out.append({"request_id": f"{factor:g}x-{r['request_id']}", "timestamp": int(start + (r["timestamp"] - t0) * factor),
                        "input_length": r["input_length"], "output_length": r["output_length"],
                        "hash_ids": [level * 10**7 + h for h in r["hash_ids"]]})  # no reuse across levels
        start = out[-1]["timestamp"] + 60_000.0
    path = folder / "levels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def truth_profile(path: Path) -> None:
    from replay.engine.hardware import get_hardware
    from replay.engine.timing import RooflineParams
    from replay.engine.timing.profile import FitStats, ProfileParams, TimingProfile, save_profile

    base = RooflineParams.from_hardware(get_hardware("h200_sxm"))
    truth = base.replace(eta_compute=base.eta_compute * TRUTH["eta_compute"],
                         eta_memory=base.eta_memory * TRUTH["eta_memory"], host_overhead_ms=TRUTH_HOST_MS,
                         mixed_layer_us=TRUTH_MIXED_US)
    save_profile(TimingProfile(hardware="h200_sxm", model="meta-llama/Llama-3.1-8B", tensor_parallel_size=1,
                               dtype="bf16", params=ProfileParams(**truth.as_dict()),
                               fit=FitStats(steps_csv="known constants", num_steps=1, mape=0.0, max_ape=0.0,
                                            mape_before=0.0, host_overhead_fixed=False)), path)


def measured_table(truth_run: Path, with_server_phases: bool = True) -> pa.Table:
    """The truth replay's per-request latencies as a log's measured columns, labelled by level."""
    req = pq.read_table(truth_run / "requests.parquet")
    req = req.filter(pc.equal(req.column("status"), "finished"))
    ids = req.column("request_id").to_pylist()
    cols = {"request_id": req.column("request_id"), "measured_ttft_ms": req.column("ttft_ms"),
            "measured_tpot_ms": req.column("tpot_ms"), "measured_e2e_ms": req.column("e2e_ms"),
            "source_run": pa.array([rid.split("-", 1)[0] for rid in ids])}
    if with_server_phases:
        cols["measured_prefill_ms"] = pc.subtract(req.column("first_token_ms"), req.column("first_scheduled_ms"))
        cols["measured_decode_ms"] = pc.subtract(req.column("finish_ms"), req.column("first_token_ms"))
    return pa.table(cols)


def build(folder: Path, requests: int, factors: list[float], with_server_phases: bool = True,
          budget: int = BUDGET_TOKENS, host_ms: float | None = None) -> tuple[Path, pa.Table]:
    """(a replay of the log with the default constants, the measured table)."""
    from replay.api import run

    log = level_log(folder, requests, factors)
    truth_profile(folder / "truth.yaml")
    limit = [f"scheduler.max_num_batched_tokens={budget}"]
    run(log, overrides=limit + [f"timing.profile={folder / 'truth.yaml'}"], outdir=folder / "truth")
    run(log, overrides=limit + ([f"timing.host_overhead_ms={host_ms}"] if host_ms is not None else []),
        outdir=folder / "base")
    return folder / "base", measured_table(folder / "truth", with_server_phases)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--levels", default="4,1,0.5,0.3", help="inter-arrival gap factors, lightest first")
    ap.add_argument("--max-evaluations", type=int, default=80)
    ap.add_argument("--fit-levels", default=None,
                    help="gap factors of the levels to fit on (default: the lightest), e.g. 4,0.5")
    ap.add_argument("--pin-host-ms", type=float, default=None,
                    help="replay with this host overhead and keep it out of the fit (as from step telemetry)")
    ap.add_argument("--budget", type=int, default=BUDGET_TOKENS, help="scheduler.max_num_batched_tokens")
    ap.add_argument("--no-server-phases", action="store_true", help="measure client-side latencies only")
    args = ap.parse_args()
    from replay.calibrate_requests import calibrate_from_requests

    factors = [float(f) for f in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        base, measured = build(Path(tmp), args.requests, factors, not args.no_server_phases, args.budget,
                               args.pin_host_ms)
        fit_levels = [float(f) for f in args.fit_levels.split(",")] if args.fit_levels else factors[:1]
        fit = calibrate_from_requests(base, measured_table=measured,
                                      fit_where=[f"source_run={f:g}x" for f in fit_levels],
                                      max_evaluations=args.max_evaluations,
                                      pin=["host_overhead_ms"] if args.pin_host_ms is not None else [])
    print(f"{fit.evaluations} replays, {fit.replay_seconds:.1f} s\n")
    print("| parameter | start | fitted | truth | bounds |\n|---|---:|---:|---:|---|")
    truth = {"host_overhead_ms": TRUTH_HOST_MS, "mixed_layer_us": TRUTH_MIXED_US}
    for p in fit.fitted:
        true = truth.get(p.name, p.start * TRUTH.get(p.name, 1.0))
        stuck = f" (at {p.at_bound} bound)" if p.at_bound else ""
        print(f"| {p.name} | {p.start:.4g} | {p.value:.4g}{stuck} | {true:.4g} | [{p.lower:g}, {p.upper:g}] |")
    print("\n| level | rows | requests | TTFT MAPE | E2E MAPE | mean TTFT error | mean E2E error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for e in fit.levels:
        b, a = e.before, e.after
        print(f"| {e.level} | {e.role} | {b.requests} | {_pct(b.ttft_mape)} -> {_pct(a.ttft_mape)} | "
              f"{_pct(b.e2e_mape)} -> {_pct(a.e2e_mape)} | {_signed(b.ttft_mean_error)} -> {_signed(a.ttft_mean_error)} | "
              f"{_signed(b.e2e_mean_error)} -> {_signed(a.e2e_mean_error)} |")


if __name__ == "__main__":
    main()
