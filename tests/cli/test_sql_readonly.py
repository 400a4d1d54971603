"""`replay sql` reads the run and nothing else: one SELECT, file access limited to the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import invoke, write_sample_run, write_sample_trace


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sql")
    return write_sample_run(root / "out", write_sample_trace(root / "t.parquet"))


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def test_views_and_the_trace_are_readable(run_dir):
    res = invoke("sql", run_dir, "SELECT (SELECT count(*) FROM requests) AS r, (SELECT count(*) FROM trace) AS t",
                 "--csv")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1] == "60,60"
    res = invoke("sql", run_dir, f"SELECT count(*) AS n FROM read_parquet('{run_dir / 'steps.parquet'}')", "--csv")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("query,message", [
    ("", "empty query"),
    ("  ;  ", "empty query"),
    ("SELECT 1; SELECT 2", "one statement at a time"),
    ("COPY (SELECT 1 AS request_id) TO '{run}/requests.parquet'", "only SELECT"),
    ("EXPORT DATABASE '{run}/x'", "only SELECT"),
    ("ATTACH '{run}/x.db'", "only SELECT"),
    ("CREATE TABLE t AS SELECT 1", "only SELECT"),
    ("INSTALL httpfs", "only SELECT"),
    ("SET enable_external_access = true", "only SELECT"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{run}/y.csv'", "only SELECT"),
    ("SELECT * FROM read_csv('/etc/passwd')", "Permission"),
    ("SELECT * FROM read_text('{run}/../t.parquet/../x')", "query failed"),
    ("SELECT bad syntax FROM", "query failed"),
])
def test_everything_but_reading_the_run_is_refused(run_dir, query, message):
    before = _snapshot(run_dir)
    res = invoke("sql", run_dir, query.format(run=run_dir))
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert _snapshot(run_dir) == before


def test_files_beside_the_run_are_out_of_reach(run_dir, tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a\n1\n")
    res = invoke("sql", run_dir, f"SELECT * FROM read_csv('{other}')")
    assert res.exit_code == 2 and "Permission" in res.output


def test_the_lockdown_cannot_be_undone_inside_a_select(run_dir):
    res = invoke("sql", run_dir, "SELECT current_setting('enable_external_access') AS e, "
                                 "current_setting('lock_configuration') AS l", "--csv")
    assert res.exit_code == 0 and res.output.splitlines()[1] == "False,True"


def test_text_in_square_brackets_is_printed_as_text(tmp_path):
    """Rich reads [red]...[/red] as markup: a value (or column name) holding brackets is escaped."""
    from tests.cli_helpers import invoke, write_sample_run, write_sample_trace

    run = write_sample_run(tmp_path / "run", write_sample_trace(tmp_path / "t.parquet", rows=10))
    res = invoke("sql", run, "SELECT '[red]x[/red] [a1, ..., ak]' AS \"[b]col\"")
    assert res.exit_code == 0, res.output
    assert "[red]x[/red] [a1, ..., ak]" in res.output and "[b]col" in res.output
