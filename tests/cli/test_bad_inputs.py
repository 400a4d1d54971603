"""Each class of bad input gives one clear line and exit code 2: never a traceback, never a hang."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import ROOT, SAMPLE, invoke, write_sample_run, write_sample_trace

_ROWS = SAMPLE.read_text().splitlines()[:20]


def _error_line(res, starts: str = "error: ") -> str:
    """The command's only output line, which must start with ``starts``, after exit code 2."""
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), res.output
    return lines[0]


def _refused_in_one_line(cases: dict, name: str, trace: Path, tmp_path: Path, monkeypatch,
                         outputs: tuple[str, ...] = ("o", "o.parquet", "r.md", "r_files")) -> None:
    """Case ``name`` of ``cases`` (args maker, message): one error line holding the message, exit 2,
    and none of the ``outputs`` the commands would write."""
    make, message = cases[name]
    monkeypatch.chdir(tmp_path)
    line = _error_line(invoke(*make(tmp_path, trace)))
    assert message in line, line
    for out in outputs:
        assert not (tmp_path / out).exists(), out


def _truncated_gz(d: Path) -> list[str]:
    whole = gzip.compress(("\n".join(_ROWS) + "\n").encode())
    (d / "t.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    return ["ingest", "t.jsonl.gz", "-o", "o.parquet"]


def _bad_utf8(d: Path, *flags: str, line: int = 1) -> list[str]:
    """Invalid UTF-8 inside the session_id string of ``line``."""
    rows = [r.encode() for r in _ROWS]
    row = json.loads(_ROWS[line - 1])
    rows[line - 1] = json.dumps({**row, "session_id": "SESSION"}).encode().replace(b"SESSION", b"s\xff\xfe")
    (d / "t.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    return ["ingest", "t.jsonl", "-o", "o.parquet", *flags]


def _binary(d: Path, name: str) -> Path:
    (d / name).write_bytes(bytes(range(256)) * 16)
    return d / name


def _garbled_parquet(path: Path) -> None:
    """Same size, footer intact, every data page flipped: the schema reads, the data does not."""
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    for i in range(4, len(data) - footer - 8, 3):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_sample_trace(tmp_path_factory.mktemp("bad") / "t.parquet")


def _case_garbled_run(d: Path, trace: Path, command: str) -> list[str]:
    out = write_sample_run(d / "out", trace)
    _garbled_parquet(out / "requests.parquet")
    if command == "report":
        return ["report", "out", "-o", "r.md"]
    return ["sql", "out", "SELECT avg(ttft_ms) FROM requests"]


CASES = {
    "ingest a directory": (lambda d, t: (d.joinpath("dir").mkdir(), ["ingest", "dir"])[1], "is a directory"),
    "run a directory": (lambda d, t: (d.joinpath("dir").mkdir(), ["run", "dir", "-o", "o"])[1], "is a directory"),
    "truncated .jsonl.gz": (lambda d, t: _truncated_gz(d), "truncated or corrupt compressed file"),
    "invalid UTF-8, detected": (lambda d, t: _bad_utf8(d), "line 1: invalid UTF-8 (byte 0xff"),
    "invalid UTF-8 in a string field": (lambda d, t: _bad_utf8(d, "--format", "mooncake"),
                                        "line 1, field 'session_id': invalid UTF-8"),
    "invalid UTF-8 past the fast reader": (lambda d, t: _bad_utf8(d, line=7),
                                           "line 7, field 'session_id': invalid UTF-8"),
    "binary CSV": (lambda d, t: (_binary(d, "b.csv"), ["ingest", "b.csv", "-o", "o.parquet"])[1], "invalid UTF-8"),
    "binary CSV, --format azure": (lambda d, t: (_binary(d, "b.csv"),
                                                 ["ingest", "b.csv", "-o", "o.parquet", "--format", "azure"])[1],
                                   "invalid UTF-8"),
    "binary config": (lambda d, t: (_binary(d, "c.yaml"), ["run", str(t), "-o", "o", "-c", "c.yaml"])[1],
                      "not a UTF-8 text file"),
    "YAML syntax error": (lambda d, t: (d.joinpath("c.yaml").write_text("scheduler:\n  max_num_seqs: [1\n"),
                                        ["run", str(t), "-o", "o", "-c", "c.yaml"])[1], "invalid YAML: line 3"),
    "--set with broken YAML": (lambda d, t: ["run", str(t), "-o", "o", "--set", "speculative={num_speculative_tokens: 2"],
                               "invalid YAML value"),
    "garbled requests.parquet, report": (lambda d, t: _case_garbled_run(d, t, "report"),
                                         "requests.parquet: damaged Parquet file"),
    "garbled requests.parquet, sql": (lambda d, t: _case_garbled_run(d, t, "sql"),
                                      "requests.parquet: damaged Parquet file"),
    "garbled trace": (lambda d, t: (d.joinpath("g.parquet").write_bytes(t.read_bytes()),
                                    _garbled_parquet(d / "g.parquet"), ["run", "g.parquet", "-o", "o"])[2],
                      "cannot read Parquet data"),
    "sql, empty query": (lambda d, t: (write_sample_run(d / "out", t), ["sql", "out", ""])[1], "empty query"),
    "--workers without clusters": (lambda d, t: ["run", str(t), "-o", "o", "--workers", "2"],
                                   "--workers replays the clusters of a fleet (fleet.clusters above 1), the "
                                   "replicas of a fleet that share nothing, or a kv_aware or least_loaded fleet's "
                                   "replicas in step, in parallel processes; here they cannot be: a single replica"),
    "--workers beside --ray": (lambda d, t: ["run", str(t), "-o", "o", "--workers", "2", "--ray", "auto",
                                             "--set", "fleet.replicas=2", "--set", "fleet.clusters=2"],
                               "--ray and --workers are two ways to spread the clusters"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_exit_2(name, trace, tmp_path, monkeypatch):
    _refused_in_one_line(CASES, name, trace, tmp_path, monkeypatch)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("args", [["ingest", "fifo.jsonl", "-o", "o.parquet"], ["run", "fifo.jsonl", "-o", "o"],
                                  ["run", "{trace}", "-o", "o", "-c", "fifo.jsonl"], ["inspect", "fifo.jsonl"]],
                         ids=["ingest", "run trace", "run config", "inspect"])
def test_a_fifo_is_refused_not_read(args, trace, tmp_path):
    """Reading a FIFO nobody writes would block forever: refused as not a regular file (in a
    subprocess with a timeout, so a regression fails instead of hanging the suite)."""
    os.mkfifo(tmp_path / "fifo.jsonl")
    cmd = [sys.executable, "-m", "replay.cli", *(a.format(trace=trace) for a in args)]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2, res.stderr
    assert "not a regular file" in res.stderr and "Traceback" not in res.stderr


def test_garbled_trace_is_named_by_the_api(trace, tmp_path):
    from replay.base.errors import TraceError
    from replay.ingest.schema import read_trace

    bad = tmp_path / "g.parquet"
    bad.write_bytes(trace.read_bytes())
    _garbled_parquet(bad)
    assert pq.read_schema(bad).names  # the footer still reads: only the data is damaged
    with pytest.raises(TraceError, match="g.parquet"):
        read_trace(bad)


def test_export_out_of_duckdb_memory_is_one_line_and_exit_2(trace, tmp_path, monkeypatch):
    """A query that cannot spill under the memory limit (or a full spill disk) ends with one line,
    not DuckDB's traceback; nothing is written. A tiny limit forces it on a real run."""
    import replay.reports.export as export_module

    write_sample_run(tmp_path / "out", trace)
    monkeypatch.setattr(export_module, "EXPORT_DUCKDB_MB", 1)
    res = invoke("export", tmp_path / "out", "-f", "vllm-bench", "-o", tmp_path / "e.json")
    _error_line(res, "error: DuckDB ran out of memory")
    assert not (tmp_path / "e.json").exists()


# --- a canonical trace is checked on read as strictly as ingest writes it ----------------------------


def _set_column(table, name: str, values, typ=None):
    import pyarrow as pa

    arr = pa.array(values, typ)
    return table.set_column(table.column_names.index(name), pa.field(name, arr.type), arr)


def _bad_trace(trace: Path, case: str, dest: Path) -> Path:
    """A copy of the sample trace broken in one way a hand-edited or foreign-written file can be."""
    import pyarrow as pa

    t = pq.read_table(trace)
    meta = dict(t.schema.metadata)
    inp = t.column("input_tokens").to_pylist()
    arr = t.column("arrival_ms").to_pylist()
    ids = t.column("request_id").to_pylist()
    hashes = t.column("hash_ids").to_pylist()
    change = {
        "null input_tokens": lambda: _set_column(t, "input_tokens", [None] + inp[1:], pa.int32()),
        "null request_id": lambda: _set_column(t, "request_id", ids[:3] + [None] + ids[4:]),
        "null arrival_ms": lambda: _set_column(t, "arrival_ms", arr[:-1] + [None], pa.int64()),
        "zero input_tokens": lambda: _set_column(t, "input_tokens", inp[:1] + [0] + inp[2:], pa.int32()),
        "negative output_tokens": lambda: _set_column(t, "output_tokens", [-3] * t.num_rows, pa.int32()),
        "zero output_tokens": lambda: _set_column(t, "output_tokens", [0] * t.num_rows, pa.int32()),
        "input_tokens as text": lambda: _set_column(t, "input_tokens", [str(x) for x in inp]),
        "input_tokens as float": lambda: _set_column(t, "input_tokens", [x + 0.5 for x in inp]),
        "input_tokens beyond int32": lambda: _set_column(t, "input_tokens", [2**40] + inp[1:], pa.int64()),
        "arrival_ms as text": lambda: _set_column(t, "arrival_ms", [str(x) for x in arr]),
        "negative arrival": lambda: _set_column(t, "arrival_ms", [-5] + arr[1:], pa.int64()),
        "absurd arrival": lambda: _set_column(t, "arrival_ms", arr[:-1] + [10**18], pa.int64()),
        "unsorted rows": lambda: _set_column(t, "arrival_ms", arr[::-1], pa.int64()),
        "duplicate request id": lambda: _set_column(t, "request_id", ids[:5] + [ids[2]] + ids[6:]),
        "hash ids one too many": lambda: _set_column(t, "hash_ids", [hashes[0] + [7]] + hashes[1:],
                                                     pa.list_(pa.uint64())),
        "null inside hash_ids": lambda: _set_column(t, "hash_ids", [hashes[0][:-1] + [None]] + hashes[1:],
                                                    pa.list_(pa.uint64())),
        "hash_ids as strings": lambda: _set_column(t, "hash_ids", [[str(h) for h in r] for r in hashes]),
        "negative delay": lambda: _set_column(t, "delay_ms", [-1] * t.num_rows, pa.int64()),
        "negative turn": lambda: _set_column(t, "turn", [-2] * t.num_rows, pa.int32()),
    }
    meta_change = {
        "hash_block_size 0": {b"replay.hash_block_size": b"0"},
        "hash_block_size negative": {b"replay.hash_block_size": b"-16"},
        "hash_block_size as text": {b"replay.hash_block_size": b'"sixteen"'},
        "metadata nested too deep": {b"replay.notes": b"[" * 100_000},
        "metadata not JSON": {b"replay.source_format": b"{oops"},
    }
    if case in meta_change:
        meta.update(meta_change[case])
    else:
        t = change[case]()
    pq.write_table(t.replace_schema_metadata(meta), dest)
    return dest


_TRACE_FIELD = {"hash_block_size 0": "hash_block_size", "hash_block_size negative": "hash_block_size",
                "hash_block_size as text": "hash_block_size", "metadata nested too deep": "replay.notes",
                "metadata not JSON": "replay.source_format", "null inside hash_ids": "hash_ids",
                "hash ids one too many": "hash_ids", "hash_ids as strings": "hash_ids",
                "duplicate request id": "request_id", "null request_id": "request_id",
                "unsorted rows": "arrival_ms", "absurd arrival": "arrival_ms", "negative arrival": "arrival_ms",
                "negative delay": "delay_ms", "negative turn": "turn"}
TRACE_CASES = ["null input_tokens", "null request_id", "null arrival_ms", "zero input_tokens",
               "negative output_tokens", "zero output_tokens", "input_tokens as text", "input_tokens as float",
               "input_tokens beyond int32", "arrival_ms as text", "negative arrival", "absurd arrival",
               "unsorted rows", "duplicate request id", "hash ids one too many", "null inside hash_ids",
               "hash_ids as strings", "negative delay", "negative turn", "hash_block_size 0",
               "hash_block_size negative", "hash_block_size as text", "metadata nested too deep",
               "metadata not JSON"]


@pytest.mark.parametrize("case", TRACE_CASES)
def test_a_canonical_trace_is_checked_on_read_as_strictly_as_ingest_writes_it(case, trace, tmp_path, monkeypatch):
    """`run` (and `inspect`, sweeps, the API: every reader of a canonical trace) refuses a Parquet
    trace that `ingest` would never have written, in one line naming the file and the field (and the
    row), instead of replaying nonsense or crashing."""
    monkeypatch.chdir(tmp_path)
    _bad_trace(trace, case, tmp_path / "bad.parquet")
    field = _TRACE_FIELD.get(case, case.split()[-1] if case.split()[-1].endswith(("_tokens", "_ms")) else
                             case.split()[0])
    # `inspect` reads neither request ids nor the session columns, and streams the hash ids itself.
    # Rows out of arrival order are fine there (it orders them itself, docs/trace-schema.md).
    inspect_reads = field not in ("request_id", "hash_ids", "turn", "delay_ms") and case != "unsorted rows"
    for args in (["run", "bad.parquet", "-o", "o", "-q"], *([["inspect", "bad.parquet"]] if inspect_reads else [])):
        line = _error_line(invoke(*args), "error: bad.parquet")
        assert field in line, (args, line)
    assert not (tmp_path / "o").exists()


def test_trace_checks_name_the_first_bad_row_and_count_the_rest(trace, tmp_path):
    from replay.base.errors import TraceError
    from replay.ingest.schema import read_trace

    with pytest.raises(TraceError, match=r"row 1, field 'output_tokens': -3 output tokens.*and 59 more rows"):
        read_trace(_bad_trace(trace, "negative output_tokens", tmp_path / "b.parquet"))
    with pytest.raises(TraceError, match=r"row 6, field 'request_id': duplicate request id \(first at row 3\)"):
        read_trace(_bad_trace(trace, "duplicate request id", tmp_path / "d.parquet"))
    table, _ = read_trace(trace)  # the good trace still reads
    assert table.num_rows == 60


# --- inputs that used to end in a traceback: nesting, wrong shapes, damaged outputs -------------------

_DEEP_JSON = "[" * 200_000 + "]" * 200_000
_DEEP_YAML = "a: " + "[" * 200_000 + "]" * 200_000


def _write(d: Path, name: str, text: str) -> Path:
    (d / name).write_text(text)
    return d / name


def _model_json(d: Path, **changes) -> str:
    import yaml

    cfg = yaml.safe_load((ROOT / "engine" / "models" / "catalog.yaml").read_text())["models"][0]["config"]
    cfg.update(changes)
    _write(d, "model.json", json.dumps(cfg))
    return "model=model.json"


def _damaged_run(d: Path, t: Path, run_json: str) -> Path:
    out = write_sample_run(d / "out", t)
    (out / "run.json").write_text(run_json)
    return out


def _sweep_dir(d: Path, t: Path, table: bytes) -> Path:
    sw = d / "sw"
    res = invoke("sweep", str(t), "--grid", "seed=1,2", "-o", str(sw), "-q", "-j", "1")
    assert res.exit_code == 0, res.output
    (sw / "sweep.parquet").write_bytes(table)
    return sw


TRACEBACK_CASES = {
    "deeply nested JSON trace, run": (lambda d, t: (_write(d, "deep.jsonl", _DEEP_JSON), ["run", "deep.jsonl", "-o", "o"])[1],
                                      "deep.jsonl: a JSON value nested too deeply"),
    "deeply nested JSON trace, ingest": (lambda d, t: (_write(d, "deep.jsonl", _DEEP_JSON),
                                                       ["ingest", "deep.jsonl", "-o", "o.parquet"])[1],
                                         "deep.jsonl: a JSON value nested too deeply"),
    "deeply nested config": (lambda d, t: (_write(d, "c.yaml", _DEEP_YAML), ["run", str(t), "-o", "o", "-c", "c.yaml"])[1],
                             "c.yaml: invalid YAML: nested too deeply"),
    "deeply nested --set": (lambda d, t: ["run", str(t), "-o", "o", "--set", "seed=" + "[" * 200_000],
                            "invalid YAML value (nested too deeply"),
    "deeply nested timing profile": (lambda d, t: (_write(d, "p.yaml", _DEEP_YAML),
                                                   ["run", str(t), "-o", "o", "--set", "timing.profile=p.yaml"])[1],
                                     "p.yaml: invalid YAML: nested too deeply"),
    "deeply nested hardware profile": (lambda d, t: (_write(d, "gpu.yaml", _DEEP_YAML),
                                                     ["run", str(t), "-o", "o", "--set", "hardware=gpu.yaml"])[1],
                                       "gpu.yaml: invalid YAML"),
    "deeply nested grid file": (lambda d, t: (_write(d, "g.yaml", _DEEP_YAML),
                                              ["sweep", str(t), "--grid", "scheduler=g.yaml", "-o", "sw"])[1],
                                "g.yaml: invalid YAML: nested too deeply"),
    "deeply nested model config.json": (lambda d, t: (_write(d, "m.json", _DEEP_JSON),
                                                      ["run", str(t), "-o", "o", "--set", "model=m.json"])[1],
                                        "m.json: invalid JSON: nested too deeply"),
    "model config.json is a list": (lambda d, t: (_write(d, "m.json", "[1, 2]"),
                                                  ["run", str(t), "-o", "o", "--set", "model=m.json"])[1],
                                    "m.json: a model config must be a JSON object"),
    "model config.json text_config not an object": (
        lambda d, t: (_write(d, "m.json", '{"text_config": 5}'), ["run", str(t), "-o", "o", "--set", "model=m.json"])[1],
        "field 'text_config' must be an object"),
    "model with zero intermediate_size": (lambda d, t: ["run", str(t), "-o", "o", "--set", _model_json(d, intermediate_size=0)],
                                          "field 'intermediate_size' must be > 0"),
    "model with zero vocab_size": (lambda d, t: ["run", str(t), "-o", "o", "--set", _model_json(d, vocab_size=0)],
                                   "field 'vocab_size' must be > 0"),
    "model with zero max_position_embeddings": (
        lambda d, t: ["run", str(t), "-o", "o", "--set", _model_json(d, max_position_embeddings=0)],
        "field 'max_position_embeddings' must be > 0"),
    "model with zero head_dim": (lambda d, t: ["run", str(t), "-o", "o", "--set", _model_json(d, head_dim=0)],
                                 "field 'head_dim' must be > 0"),
    "model with text layers": (lambda d, t: ["run", str(t), "-o", "o", "--set", _model_json(d, num_hidden_layers="32")],
                               "field 'num_hidden_layers' must be a non-negative integer"),
    "model config.json not UTF-8": (lambda d, t: ((d / "m.json").write_bytes(b"{\"a\": \"\xff\"}"),
                                                  ["run", str(t), "-o", "o", "--set", "model=m.json"])[1],
                                    "m.json: not UTF-8 text"),
    "run.json nested too deeply, report": (lambda d, t: (_damaged_run(d, t, _DEEP_JSON), ["report", "out", "-o", "r.md"])[1],
                                           "out/run.json: cannot read run info: invalid JSON: nested too deeply"),
    "run.json nested too deeply, sql": (lambda d, t: (_damaged_run(d, t, _DEEP_JSON), ["sql", "out", "SELECT 1"])[1],
                                        "out/run.json: cannot read run info: invalid JSON: nested too deeply"),
    "run.json truncated, diff": (lambda d, t: (_damaged_run(d, t, '{"config": {'), ["diff", "out", "out", "-o", "r.md"])[1],
                                 "out/run.json: cannot read run info: invalid JSON"),
    "run.json of the wrong shape, report": (lambda d, t: (_damaged_run(d, t, '{"trace": 5}'), ["report", "out", "-o", "r.md"])[1],
                                            "out/run.json: key 'trace' is an integer, expected an object"),
    "run.json trace path not text, sql": (lambda d, t: (_damaged_run(d, t, '{"trace": {"path": [1]}}'),
                                                        ["sql", "out", "SELECT 1"])[1],
                                          "key 'trace.path' is an array, expected a string"),
    "run.json not an object, export": (lambda d, t: (_damaged_run(d, t, "[]"),
                                                     ["export", "out", "-f", "vllm-bench", "-o", "o.parquet"])[1],
                                       "out/run.json: expected a JSON object"),
    "sweep.parquet garbage, report": (lambda d, t: (_sweep_dir(d, t, b"PAR1 not really"), ["report", "sw", "-o", "r.md"])[1],
                                      "sw/sweep.parquet: damaged Parquet file"),
    "sweep.parquet garbage, sql": (lambda d, t: (_sweep_dir(d, t, b"garbage"), ["sql", "sw", "SELECT * FROM sweep"])[1],
                                   "sw/sweep.parquet: damaged Parquet file"),
    "sweep.parquet another table, sql": (lambda d, t: (_sweep_dir(d, t, t.read_bytes()), ["sql", "sw", "SELECT 1"])[1],
                                         "sw/sweep.parquet: not a sweep table"),
    "sweep.json nested too deeply": (lambda d, t: (_sweep_dir(d, t, b""), (d / "sw" / "sweep.json").write_text(_DEEP_JSON),
                                                   ["sql", "sw", "SELECT 1"])[2],
                                     "sw/sweep.json: cannot read the sweep definition: invalid JSON"),
    "synth, infinite CV": (lambda d, t: ["synth", "-o", "o.parquet", "--arrival", "gamma", "--cv", "inf"],
                           "--cv inf: Input should be a finite number"),
    "synth, NaN rate": (lambda d, t: ["synth", "-o", "o.parquet", "--rate", "nan"], "--rate nan: Input should be a finite"),
    "synth, infinite think time": (lambda d, t: ["synth", "-o", "o.parquet", "--think-s", "inf"], "--think-s inf"),
}


@pytest.mark.parametrize("name", list(TRACEBACK_CASES))
def test_no_input_ends_in_a_traceback(name, trace, tmp_path, monkeypatch):
    """Nesting beyond the parsers' recursion, a file of the wrong JSON shape or with zero dimensions,
    a damaged output read back: one line naming the file (and the key), exit 2, nothing written."""
    _refused_in_one_line(TRACEBACK_CASES, name, trace, tmp_path, monkeypatch)


# --- silent nonsense: inputs that ran and gave wrong figures (or ran nothing, or never ended) ------------


def _dup_keys(d: Path) -> list[str]:
    _write(d, "c.yaml", "scheduler:\n  max_num_seqs: 8\nseed: 1\nscheduler:\n  max_num_seqs: 64\n")
    return ["-c", "c.yaml"]


NONSENSE_CASES = {
    "speedup near zero": (lambda d, t: ["run", str(t), "-o", "o", "--set", "load.speedup=1.0e-12"],
                          "load.speedup=1e-12: arrivals would reach"),
    "speedup that overflows": (lambda d, t: ["run", str(t), "-o", "o", "--set", "load.speedup=1.0e-310"],
                               "load.speedup=1e-310: arrivals would reach inf ms"),
    "Poisson rate near zero": (lambda d, t: ["run", str(t), "-o", "o", "--set", "load.mode=poisson",
                                             "--set", "load.rate=1.0e-12"], "load.rate=1e-12: arrivals would reach"),
    "block size 7": (lambda d, t: ["run", str(t), "-o", "o", "--set", "kv_cache.block_size=7"],
                     "kv_cache.block_size: Input should be a multiple of 16"),
    "block size 8": (lambda d, t: ["run", str(t), "-o", "o", "--set", "kv_cache.block_size=8"],
                     "kv_cache.block_size: Input should be a multiple of 16"),
    "duplicate YAML key": (lambda d, t: ["run", str(t), "-o", "o", *_dup_keys(d)],
                           "c.yaml: invalid YAML: line 4, column 1: duplicate key 'scheduler' (first given on line 1)"),
    "duplicate key in a --set mapping": (lambda d, t: ["run", str(t), "-o", "o", "--set", "scheduler={policy: fcfs, policy: priority}"],
                                         "duplicate key 'policy'"),
    "duplicate key in a grid file": (lambda d, t: (_write(d, "g.yaml", "max_num_seqs: 8\nmax_num_seqs: 9\n"),
                                                   ["sweep", str(t), "--grid", "scheduler=g.yaml", "-o", "sw"])[1],
                                     "g.yaml: invalid YAML: line 2, column 1: duplicate key 'max_num_seqs'"),
    "sweep over an unknown key": (lambda d, t: ["sweep", str(t), "--grid", "nosuch.key=1,2", "-o", "sw"],
                                  "--grid nosuch.key: unknown config key 'nosuch'"),
    "sweep over an unknown sub-key": (lambda d, t: ["sweep", str(t), "--grid", "scheduler.max_seqs=1,2", "-o", "sw"],
                                      "--grid scheduler.max_seqs: unknown config key 'scheduler.max_seqs'"),
    "sweep under a value": (lambda d, t: ["sweep", str(t), "--grid", "seed.x=1,2", "-o", "sw"],
                            "--grid seed.x: 'seed' is a value, not a section"),
    "plan varying an unknown key": (lambda d, t: ["plan", str(t), "--slo", "ttft_p99=1000", "--vary", "fleet.replica=1..4",
                                                  "-o", "sw"], "--vary fleet.replica: unknown config key 'fleet.replica'"),
    "sweep with no valid point": (lambda d, t: ["sweep", str(t), "--grid", "kv_cache.block_size=7,9", "-o", "sw"],
                                  "no combination of the grid is a valid config (2 tried)"),
    "diff with 0 resamples": (lambda d, t: (write_sample_run(d / "out", t), ["diff", "out", "out", "-o", "r.md", "--resamples", "0"])[1],
                              "--resamples 0: a 95% interval needs at least 100 resamples"),
    "diff with 1 resample": (lambda d, t: (write_sample_run(d / "out", t), ["diff", "out", "out", "-o", "r.md", "--resamples", "1"])[1],
                             "--resamples 1: a 95% interval needs at least 100 resamples"),
}


@pytest.mark.parametrize("name", list(NONSENSE_CASES))
def test_silent_nonsense_is_refused(name, trace, tmp_path, monkeypatch):
    """What used to run and report wrong figures (a clock too coarse for a step: TTFT 0.0), run nothing
    and exit 0, or quietly keep the last of two values, is refused in one line naming the key, exit 2."""
    _refused_in_one_line(NONSENSE_CASES, name, trace, tmp_path, monkeypatch, ("o", "r.md", "sw/sweep.parquet"))


def test_a_concurrency_beyond_the_requests_is_all_at_once(trace, tmp_path):
    """load.concurrency 2^63 - 1 (it once looped for ever opening slots) replays exactly as a
    concurrency equal to the number of requests: every request starts at 0."""
    huge = write_sample_run(tmp_path / "huge", trace, "--set", "load.mode=concurrency",
                            "--set", f"load.concurrency={2**63 - 1}")
    exact = write_sample_run(tmp_path / "exact", trace, "--set", "load.mode=concurrency", "--set", "load.concurrency=60")
    for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
        assert pq.read_table(huge / name).equals(pq.read_table(exact / name)), name


def test_too_few_resamples_give_no_interval_and_no_star():
    """A "95% CI" of one resample is that resample: no interval below MIN_RESAMPLES, never significant."""
    import numpy as np

    from replay.reports import bootstrap as bs

    rng = np.random.default_rng(0)
    a = rng.random(500)
    b = a + 5.0  # B is clearly worse: with enough resamples the interval excludes zero
    for r in (1, 2, bs.MIN_RESAMPLES - 1):
        got = bs.paired_bootstrap({"x": (a, b)}, resamples=r)["x"]
        assert got.resamples == 0 and got.mean_delta.low is None and not got.mean_delta.excludes_zero
    got = bs.paired_bootstrap({"x": (a, b)}, resamples=bs.MIN_RESAMPLES)["x"]
    assert got.mean_delta.excludes_zero


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["chunks.parquet", "steps.parquet", "requests.parquet"])
def test_changed_bytes_inside_an_output_are_never_read_as_numbers(name, trace, tmp_path):
    """Outputs carry page checksums and the reports verify them: a byte changed anywhere in a file's
    pages is refused naming the file, or (a byte no page's data depends on) reads exactly as before;
    never as other numbers (an ITL of 4.5e300 ms)."""
    from replay.base.errors import ReplayError
    from replay.reports.views import open_run

    out = write_sample_run(tmp_path / "out", trace)
    clean = pq.read_table(out / name)
    original = (out / name).read_bytes()
    footer = int.from_bytes(original[-8:-4], "little")
    end = len(original) - footer - 8
    refused = 0
    for offset in range(4, end, max(1, (end - 4) // 24)):
        (out / name).write_bytes(original)
        _flip(out / name, offset)
        try:
            run = open_run(out)
        except ReplayError as exc:
            assert f"{name}: damaged Parquet file" in str(exc)
            refused += 1
            continue
        run.con.close()
        assert pq.read_table(out / name).equals(clean), offset
    assert refused >= 20
    (out / name).write_bytes(original)
    _flip(out / name, (4 + end) // 2)
    res = invoke("sql", out, "SELECT max(1) FROM chunks")
    assert res.exit_code == 2 and res.output.startswith(f"error: {out / name}: damaged Parquet file"), res.output


_LONG_QUERY = "SELECT sum(hash(a.range * 7 + b.range)) FROM range(1000000) a, range(1000000) b"


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_long_sql_query_stops_on_ctrl_c_and_sigterm(sig, code, trace, tmp_path):
    """DuckDB runs a query in C++, where Python's handlers wait: the query runs on a helper thread and
    is cancelled, so the command ends at once with the signal's exit status."""
    out = write_sample_run(tmp_path / "out", trace)
    proc = subprocess.Popen([sys.executable, "-m", "replay.cli", "sql", str(out), _LONG_QUERY], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    time.sleep(4.0)  # started, inside the query
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert time.monotonic() - sent < 20 and "Traceback" not in err


@pytest.mark.slow
def test_sql_memory_stays_bounded_on_a_large_result(trace, tmp_path):
    """40 M result rows (640 MB as one pandas frame) stream through `replay sql` in pieces: the
    process stays far below what holding the result would take."""

    out = write_sample_run(tmp_path / "out", trace)
    query = "SELECT range AS a, range * 2 AS b FROM range(40000000)"
    script = ("import resource, sys\nfrom replay.cli import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              "sys.stderr.write(f'peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')")
    res = subprocess.run([sys.executable, "-c", script, "sql", str(out), query, "--max-rows", "3"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "39,999,997 more rows" in res.stdout, (res.stdout, res.stderr)
    peak_mb = int(res.stderr.rsplit("peak ", 1)[1]) / 1024
    assert peak_mb < 600, peak_mb
