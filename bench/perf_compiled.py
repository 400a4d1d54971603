"""Where a compiled replay spends its time, per compiled engine function, from a perf profile.

    perf record -F 250 --call-graph dwarf,32768 -o P.data -- replay run TRACE -c CONFIG -o OUT -q
    python bench/perf_compiled.py P.data [FUNCTION ...]

py-spy cannot see inside the mypyc-compiled core (it charges a compiled function's time to the
interpreted caller), and perf's own report attributes libpython's allocator and dict time to
libpython. This folds each sample's stack onto its innermost compiled function (``CPyDef_*``), so
"self" includes the library code that function called, and lists the callers and callees of the
functions named on the command line (inclusive shares of all samples). A stack is counted once per
edge, so recursion does not inflate a share.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys

_PREFIX = "CPyDef_"


def read_stacks(data: str) -> list[list[str]]:
    """Each sample's symbols, innermost first (``perf script -F ip,sym``)."""
    try:
        proc = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"], capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("perf is not installed (apt-get install linux-perf)") from None
    if proc.returncode:
        raise SystemExit(f"perf script failed on {data}: {proc.stderr.strip()[-500:]}")
    stacks: list[list[str]] = []
    current: list[str] = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line:
            if current:
                stacks.append(current)
            current = []
            continue
        parts = line.split(None, 1)
        current.append(re.sub(r"\+0x[0-9a-f]+$", "", parts[-1]))
    if current:
        stacks.append(current)
    return stacks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="perf.data recorded with --call-graph dwarf")
    ap.add_argument("functions", nargs="*", help="compiled functions (name suffixes) to show callers and callees of")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    stacks = read_stacks(args.data)
    if not stacks:
        raise SystemExit(f"{args.data}: no samples")
    total = len(stacks)
    own: collections.Counter[str] = collections.Counter()
    edges: collections.Counter[tuple[str, str]] = collections.Counter()
    for stack in stacks:
        compiled = [s[len(_PREFIX):] for s in stack if s.startswith(_PREFIX)]
        own[compiled[0] if compiled else f"(not compiled: {stack[0]})"] += 1
        for edge in set(zip(compiled[1:], compiled[:-1])):  # (caller, callee)
            edges[edge] += 1
    print(f"{total} samples; self = innermost compiled function, library code below it included")
    for name, n in own.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {name}")
    for fn in args.functions:
        print(f"\ncallees of *{fn}")
        for (caller, callee), n in edges.most_common():
            if caller.endswith(fn):
                print(f"  {100 * n / total:5.1f}%  {callee}")
        print(f"callers of *{fn}")
        for (caller, callee), n in edges.most_common():
            if callee.endswith(fn):
                print(f"  {100 * n / total:5.1f}%  {caller}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
