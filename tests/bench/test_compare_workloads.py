"""bench.compare: the named workloads file parses, and each workload's config and trace source exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compare.workloads import WORKLOADS_FILE, Skip, WorkloadError, load_workloads, resolve_trace


def test_workloads_file_is_valid_and_complete():
    wf = load_workloads()
    names = set(wf.workloads)
    assert {"mooncake-0.25x", "mooncake-0.5x", "mooncake-smallkv", "mooncake-smallkv-g2", "synth-100k",
            "ref-mtp", "ref-g2"} <= names
    for name, wl in wf.workloads.items():
        assert (WORKLOADS_FILE.parent / wl.config).is_file(), name
    assert wf.workloads["synth-100k"].sessions == "flatten"


def test_bad_workloads_are_refused(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("workloads:\n  x: {description: d, config: c.yaml}\n")
    with pytest.raises(WorkloadError, match="exactly one of trace or generate"):
        load_workloads(bad)
    bad.write_text("workloads:\n  x: {description: d, config: c.yaml, trace: t, colour: red}\n")
    with pytest.raises(WorkloadError, match="colour"):
        load_workloads(bad)
    bad.write_text("workloads:\n  x: {description: d, config: c.yaml, generate: {kind: reference, requests: 3}}\n")
    with pytest.raises(WorkloadError, match="input_tokens"):
        load_workloads(bad)


def test_missing_trace_is_a_skip_and_reference_is_generated(tmp_path):
    wf = load_workloads()
    wl = wf.workloads["mooncake-0.25x"].model_copy(update={"trace": str(tmp_path / "absent.jsonl")})
    with pytest.raises(Skip, match="absent"):
        resolve_trace("m", wl, tmp_path, Path("."))
    ref = wf.workloads["ref-g2"].model_copy(
        update={"generate": wf.workloads["ref-g2"].generate.model_copy(update={"requests": 3})})
    path, notes = resolve_trace("r", ref, tmp_path, Path("."))
    assert path.is_file() and "3 requests" in notes[0]
