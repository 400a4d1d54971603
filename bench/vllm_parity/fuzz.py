"""python -m bench.vllm_parity.fuzz: random small workloads on both schedulers (2-layer MTP, k = 2).

The Mooncake bursts of workloads.py are long prompts that always share whole 512-token trace blocks;
rules that need odd shapes (one-token prompts, prompts a token or two off a block boundary, pools of
a few dozen blocks, budgets of 16-100 tokens) never fire there. Each seed here is a handful of
requests drawn to hit such shapes:

- seeds below 100,000: 2-8 requests, prompts of 1-1,500 tokens (often near a multiple of 16),
  outputs of 1-150, a pool barely above the largest request, budgets 16-8,192;
- seeds from 100,000: 4-14 requests, longer outputs (up to 400) and a tighter pool, mostly without
  the full-prompt gate, so requests are preempted and resume on their own blocks.

Record vLLM's tables (vLLM venv), then compare ours (project env); nothing lands in tests/fixtures:

    ~/vllm-venv/bin/python -m bench.vllm_parity.fuzz --record 0:1500 --out /tmp/fz
    python -m bench.vllm_parity.fuzz --compare --out /tmp/fz

The comparison prints each differing seed with its workload and first differing step; a seed is
reproduced by recording and comparing it alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
from pathlib import Path

from bench.vllm_parity.workloads import Workload

SECOND_PROFILE = 100_000
K = 2  # drafts per step; a 2-layer MTP head, so the prefill lookahead is 2 as well


def _shared_ids(rnd: random.Random, seed: int, i: int, nb: int, fam: list[int], share: float,
                base: int, pick_family) -> list[int]:
    ids: list[int] = []
    for j in range(nb):
        if rnd.random() < share and (j == 0 or ids[-1] < 1000):
            ids.append(fam[pick_family(j)] + 100 * j)  # a prefix other requests may share
        else:
            ids.append(base + seed * 100 + i * 10 + j)  # unique from here on
    return ids


def make(seed: int) -> tuple[Workload, list[dict]]:
    """The workload and trace rows (input_length, output_length, hash_ids) of one seed."""
    rnd = random.Random(seed)
    rows = []
    if seed < SECOND_PROFILE:
        n = rnd.randint(2, 8)
        long_mode = rnd.random() < 0.4
        fam = [rnd.randint(1, 50) for _ in range(3)]
        for i in range(n):
            if long_mode:
                inp = rnd.randint(100, 1500)
            else:
                inp = rnd.choice([rnd.randint(1, 64), rnd.randint(14, 200), 16 * rnd.randint(1, 12) + rnd.randint(-2, 2)])
                inp = max(1, inp)
            ids = _shared_ids(rnd, seed, i, (inp + 511) // 512, fam, 0.6, 1000, lambda j: min(j, 2))
            out = rnd.choice([1, 2, 3, rnd.randint(1, 40), rnd.randint(20, 150)])
            rows.append({"input_length": inp, "output_length": out, "hash_ids": ids})
        need = max((r["input_length"] + r["output_length"] + 2 * K + 16) // 16 + 2 for r in rows)
        blocks = need + rnd.randint(1, need * 2)
        budget = rnd.choice([16, 33, 64, 100, 256, 8192])
        seqs = min(budget, rnd.choice([2, 4, 16]))
        rates = rnd.choice([(0.8, 0.6), (0.95, 0.9), (0.3, 0.2), (1.0, 1.0), (0.0, 0.0)])
        lpt = rnd.choice([0, 0, 20, 50])
        full_isl = rnd.random() < 0.5
    else:
        n = rnd.randint(4, 14)
        fam = [rnd.randint(1, 50) for _ in range(3)]
        for i in range(n):
            inp = rnd.choice([rnd.randint(16, 200), rnd.randint(100, 1300), 16 * rnd.randint(1, 40) + rnd.randint(-3, 3)])
            inp = max(2, inp)
            ids = _shared_ids(rnd, seed, i, (inp + 511) // 512, fam, 0.7, 10**6,
                              lambda j: rnd.randint(0, 1) if j == 0 else min(j, 2))
            out = rnd.choice([rnd.randint(1, 40), rnd.randint(20, 300), rnd.randint(100, 400)])
            rows.append({"input_length": inp, "output_length": out, "hash_ids": ids})
        need = max((r["input_length"] + r["output_length"] + 2 * K + 16) // 16 + 2 for r in rows)
        blocks = need + rnd.randint(1, need)
        budget = rnd.choice([33, 64, 100, 256, 512, 8192])
        seqs = min(budget, rnd.choice([4, 8, 16, 64]))
        rates = rnd.choice([(0.8, 0.6), (0.95, 0.9), (0.3, 0.2), (0.6, 0.4)])
        lpt = rnd.choice([0, 0, 0, 30, 100])
        full_isl = rnd.random() < 0.3
    w = Workload(name=f"fuzz{seed}", start=0, rows=n, num_gpu_blocks=blocks, max_num_batched_tokens=budget,
                 max_num_seqs=seqs, long_prefill_token_threshold=lpt, reserve_full_isl=full_isl,
                 num_spec_tokens=K, mtp_layers=2, acceptance_rates=rates, spec_seed=seed)
    return w, rows


def record(seeds: range, out: Path, models: Path) -> int:
    from bench.vllm_parity.tables import encode
    from bench.vllm_parity.vllm_driver import run_vllm

    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        path = out / f"{seed}.json.gz"
        if path.exists():
            continue
        w, rows = make(seed)
        try:
            tables, _ = run_vllm(w, rows, models)
            body: dict = {"ok": True, "tables": encode(tables)}
        except Exception as exc:  # record it and go on with the other seeds
            body = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        path.write_bytes(gzip.compress(json.dumps(body).encode(), mtime=0))
    return 0


def compare_recorded(out: Path, models: Path) -> int:
    from bench.vllm_parity.replay_driver import run_replay
    from bench.vllm_parity.tables import compare, decode

    seeds = bad = steps = preempted = failed = 0
    for path in sorted(out.glob("*.json.gz"), key=lambda p: int(p.name.split(".")[0])):
        seed = int(path.name.split(".")[0])
        body = json.loads(gzip.decompress(path.read_bytes()))
        if not body["ok"]:
            failed += 1
            continue
        w, rows = make(seed)
        vt = decode(body["tables"])
        c = compare(vt, run_replay(w, rows, models))
        seeds += 1
        steps += c.steps_vllm
        preempted += sum(len(s.preempted) for s in vt.steps)
        if not c.identical:
            bad += 1
            print(f"seed {seed}: {w}\n    {c.first_difference}", flush=True)
    print(f"{seeds} seeds, {steps} vLLM steps, {preempted} preemptions: {bad} differ"
          f" ({failed} vLLM runs failed)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vllm_parity.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", metavar="A:B", help="run vLLM on seeds A..B-1 (vLLM venv)")
    ap.add_argument("--compare", action="store_true", help="replay every recorded seed (project env)")
    ap.add_argument("--out", type=Path, required=True, help="folder of the recorded tables")
    ap.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "vllm-parity-models")
    a = ap.parse_args(argv)
    rc = 0
    if a.record:
        lo, hi = (int(x) for x in a.record.split(":"))
        rc |= record(range(lo, hi), a.out, a.models)
    if a.compare:
        rc |= compare_recorded(a.out, a.models)
    return rc


if __name__ == "__main__":
    sys.exit(main())
