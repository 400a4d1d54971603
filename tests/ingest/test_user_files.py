"""Files as users produce them: padded CSV headers, signed integers, two objects on a JSON line,
impossible measured latencies, options a format fixes, repeated flags, a user's file where the
rejected-rows list would go. Each is read right or refused in one line naming the file, line and key."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from replay.base.errors import ReplayError
from replay.ingest import convert
from replay.ingest.schema import MAX_HASH_BLOCK_SIZE
from tests.cli_helpers import invoke, write_sample_run, write_sample_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROWS = ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8",
              "2023-11-16 18:17:04.0781490,110,27", "2023-11-16 18:17:04.1206440,7433,14"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _mooncake(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _mc(t: int, out: int = 10, ids: list[int] | None = None) -> dict:
    return {"timestamp": t, "input_length": 100, "output_length": out, "hash_ids": ids or [t]}


def test_padded_csv_header_names_are_read(tmp_path):
    """A spreadsheet export pads names (``TIMESTAMP, ContextTokens``): the columns are found."""
    padded = _write(tmp_path / "az.csv", "TIMESTAMP, ContextTokens , GeneratedTokens\n"
                    + "\n".join(r.replace(",", ", ") for r in AZURE_ROWS) + "\n")
    plain = _write(tmp_path / "plain.csv", AZURE_HEADER + "\n".join(AZURE_ROWS) + "\n")
    a = convert(padded, tmp_path / "a.parquet")
    b = convert(plain, tmp_path / "b.parquet")
    assert a.rows_written == b.rows_written == 4
    cols = ["arrival_ms", "input_tokens", "output_tokens"]
    assert pq.read_table(tmp_path / "a.parquet", columns=cols) == pq.read_table(tmp_path / "b.parquet", columns=cols)
    generic = _write(tmp_path / "g.csv", "ts, prompt_len ,completion_len\n0.5,100,20\n1.0,200,30\n")
    res = convert(generic, tmp_path / "g.parquet", format="csv", time_unit="s",
                  mapping={"arrival": "ts", "input_tokens": "prompt_len", "output_tokens": "completion_len"})
    assert res.rows_written == 2
    assert pq.read_table(tmp_path / "g.parquet")["input_tokens"].to_pylist() == [100, 200]


def test_a_wanted_column_named_twice_is_refused(tmp_path):
    src = _write(tmp_path / "dup.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                 + AZURE_ROWS[0] + ",5\n")
    with pytest.raises(ReplayError, match=r"'ContextTokens' appears 2 times in the header") as exc:
        convert(src, tmp_path / "o.parquet")
    assert "line 1" in str(exc.value) and not (tmp_path / "o.parquet").exists()


def test_an_integer_with_a_plus_sign_is_an_integer(tmp_path):
    rows = list(AZURE_ROWS)
    rows[1] = "2023-11-16 18:17:04.0319600,+3180,+8"
    src = _write(tmp_path / "plus.csv", AZURE_HEADER + "\n".join(rows) + "\n")
    convert(src, tmp_path / "o.parquet")
    table = pq.read_table(tmp_path / "o.parquet")
    assert table["input_tokens"].to_pylist()[1] == 3180 and table["output_tokens"].to_pylist()[1] == 8


def test_block_size_beyond_what_the_engine_keeps_is_refused(tmp_path):
    src = _write(tmp_path / "m.jsonl", _mooncake(_mc(0), _mc(5)))
    with pytest.raises(ReplayError, match="too large"):
        convert(src, tmp_path / "o.parquet", block_size=MAX_HASH_BLOCK_SIZE + 1)
    res = invoke("ingest", src, "-o", tmp_path / "o.parquet", "--block-size", "99999999999999999999")
    assert res.exit_code == 2 and "too large" in res.output and "Traceback" not in res.output


def test_options_a_format_fixes_are_refused_and_the_unit_hint_fits_the_format(tmp_path):
    """Mooncake times are ms by the format: --time-unit there was silently ignored, and a file
    of epoch seconds was told to use it."""
    src = _write(tmp_path / "m.jsonl", _mooncake(_mc(0), _mc(5)))
    with pytest.raises(ReplayError, match="--time-unit does not apply to mooncake files"):
        convert(src, tmp_path / "o.parquet", time_unit="s")
    az = _write(tmp_path / "az.csv", AZURE_HEADER + "\n".join(AZURE_ROWS) + "\n")
    with pytest.raises(ReplayError, match="--block-size and --map does not apply to azure files"):
        convert(az, tmp_path / "o.parquet", block_size=16, mapping={"arrival": "TIMESTAMP"})
    epoch = _write(tmp_path / "epoch.jsonl", _mooncake(_mc(1_700_000_000), _mc(1_700_000_005)))
    with pytest.raises(ReplayError) as exc:
        convert(epoch, tmp_path / "o.parquet")
    text = str(exc.value)
    assert "reads as epoch s" in text and "use --time-unit" not in text and "--format jsonl|csv" in text
    assert not (tmp_path / "o.parquet").exists()


def test_measured_latencies_no_server_has_are_refused(tmp_path):
    mapping = {"arrival": "t", "input_tokens": "in", "output_tokens": "out",
               "measured_ttft_ms": "ttft", "measured_e2e_ms": "e2e"}
    below = _write(tmp_path / "below.csv", "t,in,out,ttft,e2e\n0,10,5,50,100\n1,10,5,50,20\n")
    with pytest.raises(ReplayError, match=r"line 3, field 'e2e': measured end-to-end time 20 ms is below the "
                                          r"request's TTFT 50 ms"):
        convert(below, tmp_path / "o.parquet", format="csv", time_unit="s", mapping=mapping)
    negative = _write(tmp_path / "neg.csv", "t,in,out,ttft,e2e\n0,10,5,-5,100\n")
    with pytest.raises(ReplayError, match=r"line 2, field 'ttft': negative measured time -5 ms"):
        convert(negative, tmp_path / "o.parquet", format="csv", time_unit="s", mapping=mapping)
    huge = _write(tmp_path / "huge.csv", "t,in,out,ttft,e2e\n0,10,5,1e300,1e301\n")
    with pytest.raises(ReplayError, match=r"beyond 2\^42 ms"):
        convert(huge, tmp_path / "o.parquet", format="csv", time_unit="s", mapping=mapping)
    # A one-token request's E2E equals its TTFT; the good rows of a skip run keep their values.
    mixed = _write(tmp_path / "mixed.csv", "t,in,out,ttft,e2e\n0,10,1,50,50\n1,10,5,50,20\n2,10,5,40,90\n")
    res = convert(mixed, tmp_path / "o.parquet", format="csv", time_unit="s", mapping=mapping, on_error="skip")
    assert res.rows_written == 2 and res.rows_rejected == 1
    assert pq.read_table(tmp_path / "o.parquet")["measured_e2e_ms"].to_pylist() == [50.0, 90.0]


def test_a_json_line_holding_two_objects(tmp_path):
    """pyarrow reads both objects; JSON Lines has one a line: refused, and lines after it named right."""
    first, second = json.dumps(_mc(5, ids=[1])), json.dumps(_mc(6, ids=[2]))
    clean = _write(tmp_path / "two.jsonl", json.dumps(_mc(0)) + "\n" + first + second + "\n" + json.dumps(_mc(9)) + "\n")
    with pytest.raises(ReplayError, match="line 2: the line holds more than one JSON object"):
        convert(clean, tmp_path / "o.parquet")
    later_bad = _write(tmp_path / "two_bad.jsonl", json.dumps(_mc(0)) + "\n" + first + " " + second + "\n"
                       + json.dumps(_mc(9, out=0)) + "\n" + json.dumps(_mc(12)) + "\n")
    with pytest.raises(ReplayError, match=r"line 3, field 'output_length': zero output tokens"):
        convert(later_bad, tmp_path / "o.parquet")
    # Blank lines do not hide one (a count of records against lines would), and a file of bare
    # carriage returns, which pyarrow also splits into records, is read as before.
    blanks = _write(tmp_path / "blanks.jsonl", "\n\n" + json.dumps(_mc(0)) + "\n" + first + second + "\n"
                    + json.dumps(_mc(9)) + "\n")
    with pytest.raises(ReplayError, match="line 4: the line holds more than one JSON object"):
        convert(blanks, tmp_path / "o.parquet")
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes(("\r".join(json.dumps(_mc(t)) for t in (0, 5, 9)) + "\r").encode())
    assert convert(cr, tmp_path / "cr.parquet").rows_written == 3


def test_a_line_of_spaces_in_a_csv_keeps_every_later_line_number(tmp_path):
    rows = AZURE_ROWS[:3] + ["   "] + AZURE_ROWS[3:] + ["2023-11-16 18:17:04.9960010,34,23,7"]
    src = _write(tmp_path / "ws.csv", AZURE_HEADER + "\n".join(rows) + "\n")
    res = convert(src, tmp_path / "o.parquet", on_error="skip")
    assert res.rows_written == 4
    rejected = [json.loads(line) for line in res.side_file.read_text().splitlines()]
    assert sorted((r["line"], r["reason"]) for r in rejected) == [(5, "expected 3 fields, got 1"),
                                                                    (7, "expected 3 fields, got 4")]


def test_rejected_rows_carry_their_values_under_canonical_names(tmp_path):
    src = _write(tmp_path / "g.csv", "ts,prompt_len,completion_len\n0.5,0,20\n1.0,200,30\n")
    res = convert(src, tmp_path / "o.parquet", format="csv", time_unit="s", on_error="skip",
                  mapping={"arrival": "ts", "input_tokens": "prompt_len", "output_tokens": "completion_len"})
    (rec,) = [json.loads(line) for line in res.side_file.read_text().splitlines()]
    assert rec["line"] == 2 and rec["field"] == "prompt_len"
    assert rec["record"] == {"arrival_ms": 500, "input_tokens": 0, "output_tokens": 20}
    dup = _write(tmp_path / "dup.jsonl", _mooncake({**_mc(0), "request_id": "a"}, {**_mc(3), "request_id": "a"}))
    res = convert(dup, tmp_path / "d.parquet", on_error="skip")
    (rec,) = [json.loads(line) for line in res.side_file.read_text().splitlines()]
    assert "_row" not in rec["record"] and "t_ms" not in rec["record"] and rec["record"]["arrival_ms"] == 3


def test_a_users_file_where_the_rejected_rows_go_is_never_replaced(tmp_path):
    src = _write(tmp_path / "az.csv", AZURE_HEADER + AZURE_ROWS[0] + "\n" + "2023-11-16 18:17:04.03,1,2,3\n")
    dest = tmp_path / "o.parquet"
    side = tmp_path / "o.parquet.rejected.jsonl"
    side.write_text("precious\n")
    res = invoke("ingest", src, "-o", dest, "--on-error", "skip")
    assert res.exit_code == 2 and "not a rejected-rows file" in res.output
    assert side.read_text() == "precious\n" and not dest.exists()
    side.unlink()
    assert convert(src, dest, on_error="skip").rows_rejected == 1  # its own list it replaces
    assert convert(src, dest, on_error="skip").side_file == side


def test_repeated_flags_are_all_used_or_refused(tmp_path):
    run = write_sample_run(tmp_path / "run", write_sample_trace(tmp_path / "t.parquet", rows=20))
    res = invoke("report", run, "-o", tmp_path / "r.md", "--no-charts", "--slo", "ttft=500", "--slo", "tpot=50")
    assert res.exit_code == 0, res.output
    assert "Goodput (TTFT <= 500 ms, TPOT <= 50 ms)" in (tmp_path / "r.md").read_text()
    res = invoke("report", run, "-o", tmp_path / "r2.md", "--no-charts", "--slo", "ttft=500,ttft=600")
    assert res.exit_code == 2 and "ttft is given twice" in res.output
    src = _write(tmp_path / "g.csv", "ts,a,b\n0,1,2\n")
    res = invoke("ingest", src, "-o", tmp_path / "g.parquet", "--format", "csv", "--time-unit", "s",
                 "--map", "arrival=ts", "--map", "arrival=a", "--map", "input_tokens=a", "--map", "output_tokens=b")
    assert res.exit_code == 2 and "arrival is mapped twice" in res.output


def test_diff_names_the_config_that_cannot_replay_and_a_hint_it_accepts(tmp_path):
    trace = write_sample_trace(tmp_path / "t.parquet", rows=10)
    small = _write(tmp_path / "b.yaml", "max_model_len: 64\n")
    res = invoke("diff", trace, "-b", small, "-o", tmp_path / "d.md", "--no-charts")
    assert res.exit_code == 2
    assert "replaying config B (" in res.output and "replay run --on-error skip" in res.output
    assert "pass --on-error skip" not in res.output


def test_compressed_files_ingest_cannot_read_are_named_as_such(tmp_path):
    import bz2
    import gzip

    text = _mooncake(_mc(0), _mc(5)).encode()
    (tmp_path / "m.jsonl.bz2").write_bytes(bz2.compress(text))
    with pytest.raises(ReplayError, match="a bzip2-compressed file: ingest reads plain text or gzip"):
        convert(tmp_path / "m.jsonl.bz2", tmp_path / "o.parquet")
    (tmp_path / "m.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 16)
    with pytest.raises(ReplayError, match="a zstd-compressed file"):
        convert(tmp_path / "m.jsonl.zst", tmp_path / "o.parquet", format="mooncake")
    (tmp_path / "gz.jsonl").write_bytes(gzip.compress(text))
    with pytest.raises(ReplayError, match="without the .gz suffix"):
        convert(tmp_path / "gz.jsonl", tmp_path / "o.parquet")
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(text))
    assert convert(tmp_path / "m.jsonl.gz", tmp_path / "o.parquet").rows_written == 2


def test_a_json_array_and_a_header_without_rows_get_plain_words(tmp_path):
    array = _write(tmp_path / "a.json", json.dumps([_mc(0), _mc(5)]))
    with pytest.raises(ReplayError, match="a JSON array, not JSON Lines"):
        convert(array, tmp_path / "o.parquet")
    for name, text in (("h.csv", AZURE_HEADER), ("h_nonl.csv", AZURE_HEADER.rstrip("\n"))):
        with pytest.raises(ReplayError, match="no rows in the file"):
            convert(_write(tmp_path / name, text), tmp_path / "o.parquet")


def test_where_on_a_label_the_format_does_not_carry_is_refused(tmp_path):
    src = _write(tmp_path / "m.jsonl", _mooncake(_mc(0), _mc(5)))
    with pytest.raises(ReplayError, match="mooncake files carry no tenant label"):
        convert(src, tmp_path / "o.parquet", where={"tenant": "alice"})


def test_the_trace_view_keeps_what_was_measured_and_the_labels(tmp_path):
    """A benchmark export replayed: `replay sql` can group predictions by its labels and set them
    beside its measurements (the `trace` view holds its measured_* and label columns)."""
    from replay.reports.views import open_run

    src = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "guidellm_v05_benchmarks.json"
    convert(src, tmp_path / "t.parquet", drop_failed=True)
    measured = pq.read_table(tmp_path / "t.parquet")
    run = open_run(write_sample_run(tmp_path / "run", tmp_path / "t.parquet"))
    try:
        got = run.con.sql("SELECT source_run, measured_ttft_ms FROM trace ORDER BY request_id").fetchall()
    finally:
        run.con.close()
    order = measured.sort_by("request_id")
    assert got == list(zip(order["source_run"].to_pylist(), order["measured_ttft_ms"].to_pylist()))


def test_a_nan_the_file_wrote_is_a_bad_value_not_a_missing_one(tmp_path):
    text = _mooncake(_mc(0), _mc(5)) + '{"timestamp": NaN, "input_length": 100, "output_length": 10, "hash_ids": [9]}\n'
    with pytest.raises(ReplayError, match=r"line 3, field 'timestamp.*not a finite number: nan"):
        convert(_write(tmp_path / "nan.jsonl", text), tmp_path / "o.parquet")
