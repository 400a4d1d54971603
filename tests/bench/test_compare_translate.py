"""bench.compare: our EngineConfig -> AISimulate config, and the traces handed to each side."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from bench.compare.runner import aisimulate_exe
from bench.compare.traces import (
    TraceInputError,
    canonical_to_mooncake,
    prepare,
    write_canonical,
    write_reference_trace,
)
from bench.compare.translate import PeerTraffic, TranslationError, expected_accepted_from_rates, translate
from replay.engine.config import EngineConfig
from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata, read_trace

TRAFFIC = PeerTraffic(path="/tmp/t.jsonl", block_size=512)


def cfg(**data) -> EngineConfig:
    data.setdefault("kv_cache", {"num_gpu_blocks": 55001})
    return EngineConfig.model_validate(data)


def worker(peer: dict) -> dict:
    return peer["engine"]["workers"]["aggregated"]


def test_basic_translation_maps_model_capacity_and_limits():
    tr = translate(cfg(scheduler={"max_num_batched_tokens": 4096, "max_num_seqs": 128},
                       kv_cache={"block_size": 16, "num_gpu_blocks": 55001},
                       load={"mode": "trace_timestamps", "speedup": 0.25}), TRAFFIC)
    eng = tr.peer["engine"]
    assert eng["model"] == "meta-llama/Meta-Llama-3.1-8B"
    assert eng["hardware"] == "h200_sxm" and eng["backend"] == "vllm"
    w = worker(tr.peer)
    assert w["scheduler"] == {"max_batched_tokens": 4096, "max_sequences": 128}
    # vLLM's num_gpu_blocks includes the null block; AISimulate's fixed blocks are usable blocks.
    assert w["kv_cache"]["capacity"] == {"type": "fixed", "blocks": 55000}
    assert w["kv_cache"]["block_size"] == 16  # always written: AISimulate's vLLM default is 64
    assert w["parallelism"] == {"tensor": 1}
    assert tr.peer["traffic"]["load"] == {"type": "trace_timestamps", "speedup": 0.25}
    assert tr.peer["traffic"]["source"] == {"type": "trace", "paths": ["/tmp/t.jsonl"], "format": "mooncake",
                                            "block_size": 512}
    assert "speculation" not in eng and "host_offload" not in w["kv_cache"]


def test_kv_cache_size_tokens_counts_the_null_block():
    tr = translate(cfg(kv_cache={"block_size": 16, "kv_cache_size_tokens": 16 * 1000}), TRAFFIC)
    assert worker(tr.peer)["kv_cache"]["capacity"]["blocks"] == 999


def test_capacity_from_memory_is_refused():
    with pytest.raises(TranslationError, match="num_gpu_blocks"):
        translate(EngineConfig(), TRAFFIC)


def test_concurrency_load_and_context_length():
    tr = translate(cfg(max_model_len=131072, load={"mode": "concurrency", "concurrency": 4, "max_requests": 2048}),
                   TRAFFIC)
    assert tr.peer["traffic"]["load"] == {"type": "concurrency", "concurrency": 4}
    assert tr.peer["engine"]["context_length"] == 131072
    assert any("max_requests=2048" in n for n in tr.notes)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"load": {"mode": "poisson", "rate": 2.0}}, "load.mode"),
        ({"scheduler": {"policy": "priority"}}, "scheduler.policy"),
        ({"scheduler": {"watermark": 0.01}}, "scheduler.watermark"),
        ({"scheduler": {"long_prefill_token_threshold": 512}}, "long_prefill_token_threshold"),
        ({"semantics": "0.11"}, "semantics"),
        ({"model": "some/unknown-model"}, "model"),
        ({"hardware": "a10g"}, "hardware"),
        ({"dtype": "fp8"}, "dtype"),
    ],
)
def test_untranslatable_keys_are_refused_by_name(data, key):
    with pytest.raises(TranslationError, match=key.replace(".", r"\.")):
        translate(cfg(**data), TRAFFIC)


def test_speculation_expected_tokens_and_rates():
    tr = translate(cfg(speculative={"num_speculative_tokens": 2, "expected_accepted_tokens": 1.5, "seed": 7}),
                   TRAFFIC)
    assert tr.peer["engine"]["speculation"] == {"kind": "mtp", "params": {"depth": 2},
                                                "expected_accepted_tokens": 1.5, "seed": 7}
    tr = translate(cfg(speculative={"num_speculative_tokens": 2, "acceptance_rates": [0.8, 0.5]}), TRAFFIC)
    assert tr.peer["engine"]["speculation"]["expected_accepted_tokens"] == pytest.approx(0.8 + 0.8 * 0.5)
    assert any("only the mean" in n for n in tr.notes)
    assert expected_accepted_from_rates([0.85, 0.3]) == pytest.approx(0.85 + 0.85 * 0.3)


def test_host_offload_maps_and_units():
    tr = translate(cfg(host_offload={"num_cpu_blocks": 2097152, "d2h_gbps": 32.0, "h2d_gbps": 40.0,
                                     "latency_us": 10.0}), TRAFFIC)
    assert worker(tr.peer)["kv_cache"]["host_offload"] == {
        "num_host_blocks": 2097152, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 40.0,
        "latency_to_first_byte_ms": 0.01}
    sized = translate(cfg(kv_cache={"block_size": 16, "num_gpu_blocks": 100, "kv_bytes_per_token": 131072},
                          host_offload={"size_gib": 2.0}), TRAFFIC)
    assert worker(sized.peer)["kv_cache"]["host_offload"]["num_host_blocks"] == 2 * 2**30 // (16 * 131072)
    assert worker(sized.peer)["kv_cache"]["bytes_per_token"] == 131072


def test_offload_refusals():
    with pytest.raises(TranslationError, match="speculative and host_offload"):
        translate(cfg(host_offload={"num_cpu_blocks": 10},
                      speculative={"num_speculative_tokens": 1, "expected_accepted_tokens": 0.5}), TRAFFIC)
    with pytest.raises(TranslationError, match="host_offload.block_size"):
        translate(cfg(host_offload={"num_cpu_blocks": 10, "block_size": 256}), TRAFFIC)
    with pytest.raises(TranslationError, match="host_offload.size_gib"):
        translate(cfg(host_offload={"size_gib": 1.0}), TRAFFIC)


def test_committed_workload_configs_all_translate():
    configs = sorted((Path(__file__).resolve().parents[2] / "bench" / "compare" / "configs").glob("*.yaml"))
    assert configs, "bench/compare/configs is empty"
    from replay.engine.config import load_config

    for path in configs:
        translate(load_config(path), TRAFFIC)


@pytest.mark.skipif(aisimulate_exe() is None, reason="AISimulate is not installed beside the project (~/aisim)")
def test_translation_validates_against_aisimulate_schema(tmp_path):
    """Not a prediction run: only AISimulate's own pydantic config model, in its own venv."""
    exe = aisimulate_exe()
    py = exe.parent / "python"
    tr = translate(cfg(speculative={"num_speculative_tokens": 2, "expected_accepted_tokens": 1.5},
                       load={"mode": "concurrency", "concurrency": 4}), TRAFFIC)
    path = tmp_path / "peer.yaml"
    path.write_text(yaml.safe_dump(tr.peer))
    code = ("import sys, yaml; from aisimulate.config import CorePredictionConfig; "
            "CorePredictionConfig.model_validate(yaml.safe_load(open(sys.argv[1])))")
    proc = subprocess.run([str(py), "-c", code, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- traces -------------------------------------------------------------------------------------


def _meta(block: int | None = 512) -> TraceMetadata:
    return TraceMetadata(source_format="test", source_file="t", time_unit="ms", hash_block_size=block,
                         prefix_identity="real" if block else "absent")


def _table(rows: list[dict]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in TRACE_SCHEMA}
    return pa.table(cols, schema=TRACE_SCHEMA)


def test_canonical_to_mooncake_sorts_and_fills_missing_ids(tmp_path):
    table = _table([
        {"request_id": "b", "arrival_ms": 50, "input_tokens": 600, "output_tokens": 3, "hash_ids": [0, 7]},
        {"request_id": "a", "arrival_ms": 10, "input_tokens": 1000, "output_tokens": 2, "hash_ids": None},
    ])
    block, notes = canonical_to_mooncake(table, _meta(512), tmp_path / "t.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert block == 512
    assert [r["timestamp"] for r in rows] == [10, 50]
    assert len(rows[0]["hash_ids"]) == 2 and rows[0]["hash_ids"][0] >= 1 << 62  # fresh, never shared
    assert rows[1] == {"timestamp": 50, "input_length": 600, "output_length": 3, "hash_ids": [0, 7]}


def test_reference_trace_has_distinct_prompts(tmp_path):
    path = tmp_path / "ref.parquet"
    write_reference_trace(path, requests=5, input_tokens=120000, output_tokens=64, hash_block_size=512)
    table, meta = read_trace(path)
    assert meta.hash_block_size == 512 and meta.prefix_identity == "synthesized"
    ids = table.column("hash_ids").to_pylist()
    per = math.ceil(120000 / 512)
    assert all(len(x) == per for x in ids)
    assert len({i for x in ids for i in x}) == 5 * per
    assert set(table.column("input_tokens").to_pylist()) == {120000}


def test_prepare_cuts_mooncake_for_max_requests(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps({"timestamp": i, "input_length": 10, "output_length": 2, "hash_ids": [i]})
                           + "\n" for i in range(10)))
    prep = prepare(src, tmp_path / "w", max_requests=4)
    assert prep.ours_path == src and prep.rows == 4
    assert len(prep.peer_path.read_text().splitlines()) == 4
    full = prepare(src, tmp_path / "w2", max_requests=None)
    assert full.peer_path == src and full.rows == 10 and full.peer_block_size == 512


def test_prepare_refuses_or_flattens_sessions(tmp_path):
    table = _table([
        {"request_id": "s1", "arrival_ms": 0, "input_tokens": 100, "output_tokens": 2, "hash_ids": [1],
         "session_id": "s", "turn": 0},
        {"request_id": "s2", "arrival_ms": 900, "input_tokens": 600, "output_tokens": 2, "hash_ids": [1, 2],
         "session_id": "s", "parent_id": "s1", "turn": 1, "delay_ms": 500},
    ])
    path = tmp_path / "s.parquet"
    write_canonical(table, _meta(), path)
    with pytest.raises(TraceInputError, match="sessions"):
        prepare(path, tmp_path / "w", max_requests=None)
    prep = prepare(path, tmp_path / "w", max_requests=None, sessions="flatten")
    flat, _ = read_trace(prep.ours_path)
    assert flat.column("session_id").null_count == 2 and flat.column("delay_ms").null_count == 2
    assert flat.column("arrival_ms").to_pylist() == [0, 900]
    assert [json.loads(x)["timestamp"] for x in prep.peer_path.read_text().splitlines()] == [0, 900]


def test_prepare_rejects_unknown_inputs(tmp_path):
    with pytest.raises(TraceInputError, match="no such trace"):
        prepare(tmp_path / "missing.jsonl", tmp_path / "w", max_requests=None)
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n")
    with pytest.raises(TraceInputError, match="canonical Parquet trace or a Mooncake JSONL"):
        prepare(bad, tmp_path / "w", max_requests=None)


@pytest.mark.parametrize("prompt_only", [True, False])
def test_generated_block_stores_are_noted_as_ours_only(prompt_only):
    tr = translate(cfg(kv_cache={"block_size": 16, "num_gpu_blocks": 1001, "offload_prompt_only": prompt_only},
                       host_offload={"num_cpu_blocks": 5000}), TRAFFIC)
    noted = any("offload_prompt_only=false applies to ours only" in n for n in tr.notes)
    assert noted is not prompt_only
