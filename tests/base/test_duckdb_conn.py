"""Report databases spill past their memory budget into their own temp directory, never the working
directory, and leave nothing behind once closed (replay/base/duckdb_conn.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import replay.base.duckdb_conn as duckdb_conn


@pytest.mark.slow
def test_spills_past_the_budget_into_its_own_directory_and_cleans_up(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # DuckDB's default would be ./.tmp
    monkeypatch.setattr(duckdb_conn.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    con = duckdb_conn.connect(64)
    assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0].startswith("61")  # 64 MB in MiB
    # About 150 MB of strings: more than the budget, so DuckDB must write temp files to hold them.
    con.execute("CREATE TEMP TABLE t AS SELECT md5(range::VARCHAR) || md5(range::VARCHAR) AS s FROM range(2000000)")
    spilled = list((tmp_path / "tmp").glob("replay-duckdb-*/*"))
    assert spilled, "expected DuckDB to spill"
    assert con.execute("SELECT count(DISTINCT s) FROM t").fetchall()[0][0] == 2_000_000
    con.close()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not Path(".tmp").exists()
