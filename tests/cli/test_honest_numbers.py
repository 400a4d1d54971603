"""No silently wrong number: rebased clocks, refused magnitudes and null ids, unknown reuse said so,
the replayed count, a report that checks it reads the trace that was replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import ROOT, SAMPLE, invoke, write_sample_run, write_sample_trace

_ROWS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:40]]
EPOCH_MS = 1_732_000_000_123  # a Unix-epoch millisecond clock, as some Mooncake-style logs carry


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_epoch_clock_is_rebased_and_the_offset_kept(tmp_path):
    plain = _jsonl(tmp_path / "plain.jsonl", _ROWS)
    epoch = _jsonl(tmp_path / "epoch.jsonl", [{**r, "timestamp": r["timestamp"] + EPOCH_MS} for r in _ROWS])
    for src in (plain, epoch):
        assert invoke("ingest", src, "-o", src.with_suffix(".parquet")).exit_code == 0
    a, b = pq.read_table(tmp_path / "plain.parquet"), pq.read_table(tmp_path / "epoch.parquet")
    assert a.column("arrival_ms").equals(b.column("arrival_ms"))
    assert b.column("arrival_ms")[0].as_py() == 0
    meta = {k.decode(): json.loads(v) for k, v in b.schema.metadata.items()}
    assert meta["replay.arrival_offset_ms"] == EPOCH_MS
    # so the replay is the same to the last bit: no float64 precision lost to a large clock
    for name in ("plain", "epoch"):
        write_sample_run(tmp_path / f"out_{name}", tmp_path / f"{name}.parquet")
    assert (tmp_path / "out_plain" / "requests.parquet").read_bytes() == \
        (tmp_path / "out_epoch" / "requests.parquet").read_bytes()


@pytest.mark.parametrize("row,field,message", [
    ({"timestamp": 10**18}, "timestamp", "beyond 2^42 ms"),
    ({"hash_ids": [None] + _ROWS[5]["hash_ids"][1:]}, "hash_ids", "null inside hash_ids"),
])
def test_unrepresentable_values_are_refused_with_line_and_field(tmp_path, row, field, message):
    rows = [dict(r) for r in _ROWS]
    rows[5] = {**rows[5], **row}
    src = _jsonl(tmp_path / "t.jsonl", rows)
    res = invoke("ingest", src, "-o", tmp_path / "t.parquet")
    assert res.exit_code == 2
    assert f"t.jsonl, line 6, field '{field}': " in res.output and message in res.output


def test_unknown_reuse_is_said_so_and_the_replayed_count_shown(tmp_path):
    res = invoke("run", ROOT / "sample_traces" / "azure_code.csv", "-o", tmp_path / "out",
                 "--set", "load.max_requests=40")
    assert res.exit_code == 0, res.output
    assert "Replay of 40 requests" in res.output
    assert "GPU prefix hit ratio     unknown (the trace has no prefix ids)" in res.output
    assert "0.0000" not in res.output
    rep = invoke("report", tmp_path / "out", "-o", tmp_path / "r.md", "--no-charts")
    assert rep.exit_code == 0, rep.output
    assert "unknown (the trace has no prefix ids)" in (tmp_path / "r.md").read_text()


def test_markup_in_messages_survives(capsys):
    """The aic install hint (``pip install -e '.[aic]'``) must print with its brackets."""
    import typer

    from replay.base.errors import ConfigError
    from replay.commands._common import user_errors
    from replay.engine.timing.aic import INSTALL_HINT

    with pytest.raises(typer.Exit), user_errors():
        raise ConfigError(f"timing backend 'aic' needs aiconfigurator-core: {INSTALL_HINT}")
    assert "'.[aic]'" in capsys.readouterr().err


@pytest.fixture
def run_of_copy(tmp_path) -> Path:
    trace = write_sample_trace(tmp_path / "t.parquet")
    return write_sample_run(tmp_path / "out", trace)


def test_report_refuses_a_changed_trace(run_of_copy, tmp_path):
    write_sample_trace(tmp_path / "t.parquet", rows=50)  # overwritten after the run
    res = invoke("report", run_of_copy, "-o", tmp_path / "r.md", "--no-charts")
    assert res.exit_code == 0, res.output
    assert "is not the one replayed" in " ".join(res.output.split())
    assert "The ideal is unavailable for this run." in (tmp_path / "r.md").read_text()


def test_report_says_when_the_fingerprint_is_missing(run_of_copy, tmp_path):
    info = json.loads((run_of_copy / "run.json").read_text())
    del info["trace"]["fingerprint"]
    (run_of_copy / "run.json").write_text(json.dumps(info))
    res = invoke("report", run_of_copy, "-o", tmp_path / "r.md", "--no-charts")
    assert res.exit_code == 0 and "no trace fingerprint" in " ".join(res.output.split())


def test_a_copied_outdir_uses_its_own_verified_trace(tmp_path):
    out = tmp_path / "out"
    assert invoke("run", SAMPLE, "-o", out, "-q", "--set", "load.max_requests=30").exit_code == 0
    moved = tmp_path / "moved"
    out.rename(moved)
    from replay.reports.views import open_run

    run = open_run(moved)
    try:
        assert run.trace_path == moved / "trace.parquet" and not run.notes
    finally:
        run.con.close()
