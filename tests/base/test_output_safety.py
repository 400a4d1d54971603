"""No command loses a user's file: outputs replace only our own earlier outputs, never an input,
and an interrupted or failed command leaves the old output whole and no temp file behind."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.base import atomic
from replay.base.atomic import MARKER, OutputError, atomic_dir, is_replay_output
from tests.cli_helpers import ROOT, SAMPLE, write_sample_run, write_sample_trace
from tests.cli_helpers import invoke as _invoke


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_sample_trace(tmp_path_factory.mktemp("trace") / "t.parquet")


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".replay-" in p.name)


def test_run_refuses_a_directory_that_is_not_a_replay_output(trace, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "precious.txt").write_text("x")
    res = _invoke("run", str(trace), "-o", str(results), "-q")
    assert res.exit_code == 2
    assert "not a replay output" in res.output and "Traceback" not in res.output
    assert (results / "precious.txt").read_text() == "x"
    assert _leftovers(tmp_path) == []


def test_run_replaces_its_own_output_and_an_empty_directory(trace, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert _invoke("run", str(trace), "-o", str(out), "-q").exit_code == 0
    assert is_replay_output(out)
    first = (out / "requests.parquet").read_bytes()
    (out / "requests.parquet").write_bytes(b"stale")
    assert _invoke("run", str(trace), "-o", str(out), "-q").exit_code == 0
    assert (out / "requests.parquet").read_bytes() == first
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("target", ["trace", "trace_dir", "cwd", "parent_of_cwd"])
def test_run_refuses_an_output_that_is_or_holds_its_input(trace, tmp_path, monkeypatch, target):
    d = tmp_path / "d"
    d.mkdir()
    local = d / "t.parquet"
    local.write_bytes(trace.read_bytes())
    work = d / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    out = {"trace": str(local), "trace_dir": str(d), "cwd": ".", "parent_of_cwd": ".."}[target]
    res = _invoke("run", str(local), "-o", out, "-q")
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and "Traceback" not in res.output
    assert local.read_bytes() == trace.read_bytes()
    assert _leftovers(d) == [] and _leftovers(tmp_path) == [] and _leftovers(work) == []


def test_run_refuses_its_own_kept_trace_as_input(tmp_path):
    """A raw trace is kept as OUTDIR/trace.parquet; replaying that into the same OUTDIR would delete it."""
    out = tmp_path / "out"
    assert _invoke("run", str(ROOT / "sample_traces" / "azure_code.csv"), "-o", str(out), "-q",
                   "--set", "load.max_requests=20").exit_code == 0
    kept = (out / "trace.parquet").read_bytes()
    res = _invoke("run", str(out / "trace.parquet"), "-o", str(out), "-q")
    assert res.exit_code == 2 and "holding the input" in res.output
    assert (out / "trace.parquet").read_bytes() == kept


def test_no_overwrite_on_existing_dir_is_one_line(trace, tmp_path):
    out = tmp_path / "out"
    assert _invoke("run", str(trace), "-o", str(out), "-q").exit_code == 0
    res = _invoke("run", str(trace), "-o", str(out), "-q", "--no-overwrite")
    assert res.exit_code == 2 and "already exists" in res.output and "Traceback" not in res.output


def test_ingest_refuses_to_write_onto_its_source(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_bytes(SAMPLE.read_bytes()[:5000].rsplit(b"\n", 1)[0] + b"\n")
    before = src.read_bytes()
    res = _invoke("ingest", str(src), "-o", str(src))
    assert res.exit_code == 2 and "the output is the input" in res.output
    assert src.read_bytes() == before
    assert _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def run_dir(trace, tmp_path_factory) -> Path:
    return write_sample_run(tmp_path_factory.mktemp("run") / "out", trace)


@pytest.mark.parametrize("name", ["run.json", "requests.parquet", "steps.parquet"])
def test_report_refuses_to_write_onto_the_runs_files(run_dir, name):
    before = (run_dir / name).read_bytes()
    res = _invoke("report", str(run_dir), "-o", str(run_dir / name), "--no-charts")
    assert res.exit_code == 2 and "the output is the input" in res.output
    assert (run_dir / name).read_bytes() == before
    res = _invoke("report", str(run_dir), "-o", str(run_dir.parent / "r.md"), "--json", str(run_dir / name))
    assert res.exit_code == 2 and (run_dir / name).read_bytes() == before
    assert not (run_dir.parent / "r_files").exists()


def test_report_onto_a_directory_leaves_nothing_half_written(run_dir, tmp_path):
    (tmp_path / "r.md").mkdir()
    res = _invoke("report", str(run_dir), "-o", str(tmp_path / "r.md"))
    assert res.exit_code == 2 and "is a directory" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r_files").exists() and _leftovers(tmp_path) == []


def test_report_charts_dir_of_the_user_is_not_replaced(run_dir, tmp_path):
    (tmp_path / "r_files").mkdir()
    (tmp_path / "r_files" / "mine.png").write_bytes(b"x")
    res = _invoke("report", str(run_dir), "-o", str(tmp_path / "r.md"))
    assert res.exit_code == 2 and "not a replay output" in res.output
    assert (tmp_path / "r_files" / "mine.png").read_bytes() == b"x" and not (tmp_path / "r.md").exists()


def test_report_charts_dir_may_not_be_the_run_dir(run_dir):
    """`report runx_files -o runx.md` would put the charts where the run is: refused."""
    charts = run_dir.parent / "runx_files"
    charts.mkdir()
    (charts / "run.json").write_text((run_dir / "run.json").read_text())
    for f in ("requests.parquet", "chunks.parquet", "steps.parquet", MARKER):
        (charts / f).write_bytes((run_dir / f).read_bytes())
    res = _invoke("report", str(charts), "-o", str(run_dir.parent / "runx.md"))
    assert res.exit_code == 2 and "the output is the input" in res.output
    assert (charts / "requests.parquet").exists()


# --- atomic_dir itself -------------------------------------------------------------------------


def _replay_output(path: Path, content: str) -> None:
    with atomic_dir(path) as tmp:
        (tmp / "f").write_text(content)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_atomic_dir_swaps_in_the_new_output(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    _replay_output(out, "old")
    _replay_output(out, "new")
    assert (out / "f").read_text() == "new" and is_replay_output(out)
    assert _leftovers(tmp_path) == []


def test_renameat2_exchange_is_used_on_linux(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("RENAME_EXCHANGE is Linux only; elsewhere the documented two-rename fallback runs")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "x").write_text("b")
    if not atomic._exchange(a, b):
        pytest.skip("this filesystem refuses RENAME_EXCHANGE (fallback path covered above)")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


def test_atomic_dir_rolls_back_when_the_run_fails_midway(trace, tmp_path):
    """A failure inside the engine (here: from the progress callback, mid-run) keeps the old output."""
    from replay.engine.config import EngineConfig
    from replay.engine.run import replay_trace
    from replay.ingest.schema import read_trace

    out = tmp_path / "out"
    table, meta = read_trace(trace)
    replay_trace(table, meta, EngineConfig(), out, trace_path=trace)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []

    def boom(sim_ms: float, done: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise RuntimeError("mid-run failure")

    with pytest.raises(RuntimeError, match="mid-run"):
        replay_trace(table, meta, EngineConfig(), out, trace_path=trace, progress=boom)
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path) == []


def test_stale_temps_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale_dir = tmp_path / f".out.replay-{dead_pid}-abc123.tmp"
    stale_dir.mkdir()
    live = tmp_path / f".out.replay-{os.getpid()}-zzz.tmp"
    live.write_text("in use")
    user = tmp_path / ".out.mine.tmp"
    user.write_text("not ours")
    _replay_output(out, "x")
    assert not stale_dir.exists() and live.exists() and user.exists()
    stale_file = tmp_path / f".t.parquet.replay-{dead_pid}-q1w2e3.tmp"
    stale_file.write_text("half")
    atomic.write_text_atomic(tmp_path / "t.parquet", "whole")
    assert not stale_file.exists()


def test_output_error_is_a_replay_error():
    from replay.base.errors import ReplayError

    assert issubclass(OutputError, ReplayError)


# --- ingest side file ----------------------------------------------------------------------------


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(i: int, **kw) -> dict:
    return {"timestamp": i * 10, "input_length": 100, "output_length": 10, "hash_ids": [i], **kw}


def test_stale_rejects_file_is_removed_on_a_clean_reingest(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [_row(0), _row(1, input_length=-5), _row(2)])
    dest = tmp_path / "t.parquet"
    assert _invoke("ingest", str(src), "-o", str(dest), "--on-error", "skip").exit_code == 0
    side = tmp_path / "t.parquet.rejected.jsonl"
    assert side.exists()
    _jsonl(src, [_row(0), _row(1), _row(2)])
    assert _invoke("ingest", str(src), "-o", str(dest)).exit_code == 0
    assert not side.exists()


def test_a_users_file_named_like_the_rejects_file_is_kept(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [_row(0), _row(1)])
    side = tmp_path / "t.parquet.rejected.jsonl"
    side.write_text('{"my": "notes"}\n')
    assert _invoke("ingest", str(src), "-o", str(tmp_path / "t.parquet")).exit_code == 0
    assert side.read_text() == '{"my": "notes"}\n'


def test_no_usable_rows_names_the_rejects_file(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [_row(0, input_length=-1), _row(1, input_length=-2)])
    res = _invoke("ingest", str(src), "-o", str(tmp_path / "t.parquet"), "--on-error", "skip")
    assert res.exit_code == 2 and "no usable rows" in res.output
    assert "t.parquet.rejected.jsonl" in res.output
    assert (tmp_path / "t.parquet.rejected.jsonl").exists() and not (tmp_path / "t.parquet").exists()


# --- signals -----------------------------------------------------------------------------------


def _run_cli(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "replay.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_temp(directory: Path, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if any(p.name.startswith(".big.replay-") for p in directory.iterdir()):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_signal_removes_temps_keeps_old_output_and_says_so(tmp_path, sig, code, word):
    old = _run_cli(["run", str(SAMPLE), "-o", "big", "-q", "--set", "load.max_requests=50"], tmp_path)
    assert old.wait(120) == 0, old.stderr.read()
    before = (tmp_path / "big" / "requests.parquet").read_bytes()
    proc = _run_cli(["run", str(SAMPLE), "-o", "big", "-q"], tmp_path)
    try:
        assert _wait_for_temp(tmp_path, proc), "the run never created its temp directory"
        time.sleep(0.3)  # into the replay proper
        proc.send_signal(sig)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    if rc == 0:
        pytest.skip("the run finished before the signal arrived (machine too fast for this trace)")
    assert rc == code, stderr
    assert stderr.strip().splitlines() == [f"replay: {word}; unfinished outputs are discarded, "
                                           "finished ones are unchanged"]
    assert (tmp_path / "big" / "requests.parquet").read_bytes() == before
    assert _leftovers(tmp_path) == []


# --- never replace what is not ours: special files as -o, and every file a run reads ---------------


def _special_target(kind: str, d: Path) -> Path:
    """An existing path that is not a regular file: replacing it would lose or break something."""
    target = d / f"target-{kind}"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("only root can make a device node")
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    elif kind == "symlink to a file":
        (d / "real.txt").write_text("keep")
        target.symlink_to(d / "real.txt")
    elif kind == "dangling symlink":
        target.symlink_to(d / "nowhere.txt")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(target))
        sock.close()
    return target


def _file_output_commands(trace: Path, run_dir: Path, target: Path) -> dict[str, list[str]]:
    return {"ingest": ["ingest", str(SAMPLE), "-o", str(target)],
            "synth": ["synth", "-o", str(target), "--requests", "10"],
            "report": ["report", str(run_dir), "-o", str(target), "--no-charts"],
            "export": ["export", str(run_dir), "-f", "vllm-bench", "-o", str(target)],
            "diff": ["diff", str(run_dir), str(run_dir), "-o", str(target), "--no-charts"]}


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink to a file", "dangling symlink", "socket"])
@pytest.mark.parametrize("command", ["ingest", "synth", "report", "export", "diff"])
def test_a_file_output_never_replaces_a_special_file_or_a_link(trace, run_dir, tmp_path, kind, command):
    """-o onto a FIFO, device node, socket or symbolic link is refused in one line (exit 2) and the
    path is left exactly as it was: replacing /dev/null (as root) or a link's target is data loss."""
    target = _special_target(kind, tmp_path)
    before = os.lstat(target)
    res = _invoke(*_file_output_commands(trace, run_dir, target)[command])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(target) in lines[0], res.output
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    if kind == "symlink to a file":
        assert (tmp_path / "real.txt").read_text() == "keep"
    assert _leftovers(tmp_path) == []


def _hf_config(path: Path) -> Path:
    import yaml

    catalog = yaml.safe_load((ROOT / "engine" / "models" / "catalog.yaml").read_text())
    path.write_text(json.dumps(catalog["models"][0]["config"]))
    return path


def _inputs_in_outdir(out: Path, kind: str) -> tuple[list[str], list[str], Path]:
    """(-c args, --set args, the input file) for a config-read file kept inside OUTDIR."""
    if kind == "config":
        (out / "c.yaml").write_text("seed: 3\n")
        return ["-c", str(out / "c.yaml")], [], out / "c.yaml"
    if kind == "timing profile":
        from replay.engine.timing.profile import FitStats, ProfileParams, TimingProfile, save_profile

        params = ProfileParams(eta_compute=0.6, eta_attention=0.5, eta_memory=0.8, tau_layer_us=5.0,
                               host_overhead_ms=1.0, allreduce_latency_us=5.0, eta_nvlink=0.7)
        fit = FitStats(steps_csv="steps.csv", num_steps=10, mape=0.05, max_ape=0.1, mape_before=0.2,
                       host_overhead_fixed=False)
        save_profile(TimingProfile(hardware="h200_sxm", model="meta-llama/Llama-3.1-8B", tensor_parallel_size=1,
                                   dtype="bf16", params=params, fit=fit), out / "p.yaml")
        return [], [f"timing.profile={out / 'p.yaml'}"], out / "p.yaml"
    if kind == "hardware profile":
        shipped = ROOT / "engine" / "hardware" / "profiles" / "h200_sxm.yaml"
        (out / "gpu.yaml").write_text(shipped.read_text())
        return [], [f"hardware={out / 'gpu.yaml'}"], out / "gpu.yaml"
    if kind == "model config.json":
        return [], [f"model={_hf_config(out / 'config.json')}"], out / "config.json"
    _hf_config(out / "config.json")  # model folder = OUTDIR itself
    return [], [f"model={out}"], out / "config.json"


@pytest.mark.parametrize("kind", ["config", "timing profile", "hardware profile", "model config.json",
                                  "model folder"])
@pytest.mark.parametrize("command", ["run", "diff -a", "api"])
def test_a_file_the_run_reads_is_never_deleted_with_its_output_folder(trace, tmp_path, kind, command):
    """Every file a run reads (the config, a timing profile, a model's config.json) is an input: an
    output folder that holds one is refused, never replaced, whichever command runs it."""
    out = tmp_path / ("d_runs" if command == "diff -a" else "") / ("a" if command == "diff -a" else "out")
    write_sample_run(out, trace)
    config_args, sets, kept = _inputs_in_outdir(out, kind)
    before = kept.read_bytes()
    if command == "api":
        from replay.api import run
        from replay.base.errors import ReplayError

        with pytest.raises(ReplayError, match="holding the input|the output is the input"):
            run(trace, config_args[1] if config_args else None, overrides=sets, outdir=out)
    else:
        args = (["run", str(trace), "-o", str(out), "-q"] if command == "run" else
                ["diff", str(trace), "-a", config_args[1] if config_args else str(_empty(tmp_path)),
                 "-o", str(tmp_path / "d.md")])
        args += config_args if command == "run" else []
        sets_flag = "--set" if command == "run" else "--set-a"
        for item in sets:
            args += [sets_flag, item]
        res = _invoke(*args)
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert lines[-1].startswith("error: ") and str(kept) in lines[-1], res.output
        assert not (tmp_path / "d.md").exists()
    assert kept.read_bytes() == before and is_replay_output(out)
    assert _leftovers(out.parent) == []


def _empty(d: Path) -> Path:
    (d / "empty.yaml").write_text("{}\n")
    return d / "empty.yaml"


def test_sweep_refuses_a_config_kept_in_its_runs_folder(trace, tmp_path):
    (tmp_path / "sw" / "runs").mkdir(parents=True)
    kept = tmp_path / "sw" / "runs" / "base.yaml"
    kept.write_text("seed: 1\n")
    res = _invoke("sweep", str(trace), "-c", str(kept), "--grid", "seed=1,2", "-o", str(tmp_path / "sw"), "-q")
    assert res.exit_code == 2 and "holding the input" in res.output, res.output
    assert kept.read_text() == "seed: 1\n"


def test_a_long_valid_output_name_gets_a_short_enough_temp_name(trace, tmp_path):
    """The temp name adds characters to the output's name: a valid 250-byte name must still work
    (ENAMETOOLONG otherwise), for a folder and for a file, and stale-temp cleanup still finds it."""
    long_dir = tmp_path / ("d" * 250)
    assert _invoke("run", str(trace), "-o", str(long_dir), "-q").exit_code == 0
    assert is_replay_output(long_dir)
    long_file = tmp_path / ("f" * 246 + ".parquet")
    res = _invoke("ingest", str(SAMPLE), "-o", str(long_file))
    assert res.exit_code == 0, res.output
    assert long_file.is_file() and _leftovers(tmp_path) == []
    stem = atomic._tmp_stem(long_dir)
    assert len(os.fsencode(stem)) + atomic._TMP_EXTRA <= atomic._NAME_MAX


def test_a_mount_point_is_refused_as_an_output_folder(tmp_path, monkeypatch, trace):
    """A mount point cannot be renamed (EBUSY): refused up front in one line, not a traceback."""
    out = tmp_path / "mnt"
    out.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out)
    res = _invoke("run", str(trace), "-o", str(out), "-q")
    assert res.exit_code == 2 and "is a mount point" in res.output, res.output


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EIO])
def test_a_write_the_system_refuses_names_the_output_and_keeps_the_old_one(trace, tmp_path, monkeypatch, err):
    """Disk full, read-only filesystem, no permission, quota, I/O error, while the new output is being
    written: one line naming the output (not our temp name), exit 2, the old output whole, no temp left."""
    out = write_sample_run(tmp_path / "out", trace)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def refuse(directory, kind):
        raise OSError(err, os.strerror(err), str(Path(directory) / MARKER))

    monkeypatch.setattr(atomic, "write_marker", refuse)
    res = _invoke("run", str(trace), "-o", str(out), "-q")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: cannot write the output: {os.strerror(err)}")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _leftovers(tmp_path) == []


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC, errno.EACCES])
def test_a_file_output_the_system_refuses_is_one_line(tmp_path, monkeypatch, err):
    def refuse(*args, **kwargs):
        raise OSError(err, os.strerror(err), str(tmp_path / ".t.parquet.replay-1-x.tmp"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", refuse)
    res = _invoke("ingest", str(SAMPLE), "-o", str(tmp_path / "t.parquet"))
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {tmp_path / 't.parquet'}: cannot write the output: {os.strerror(err)}")
    assert not (tmp_path / "t.parquet").exists()
