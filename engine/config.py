"""Engine configuration: pydantic models whose key names follow vLLM's engine arguments.

Unknown keys are rejected everywhere (a typo must never silently fall back to a default). Types are
strict (YAML's ``true`` is not the integer 1, ``2.0`` is not an integer, ``"8"`` is not a number) and
floats must be finite (``.inf``/``.nan`` refused). Checks against the model and the GPU that vLLM
makes at start-up (``check_model_limits``) refuse what vLLM would refuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from replay.base.errors import ConfigError, ReplayError
from replay.base.files import require_regular_file
from replay.base.structured import load_yaml
from replay.engine.fleet_config import FleetConfig
from replay.engine.hardware import get_hardware
from replay.engine.kv_tier_config import HOST_OFFLOAD_TIER_NAME, KVTierConfig, check_tier_chain
from replay.engine.load_window import parse_window
from replay.engine.models import ModelSpec, get_model
from replay.engine.strict_model import StrictModel

# Bytes per element of each weight and KV dtype.
DTYPE_BYTES = {"bf16": 2, "fp8": 1}


class SchedulerConfig(StrictModel):
    # vLLM defaults on a >= 70 GiB GPU (vLLM's `EngineArgs` defaults, vllm/engine/arg_utils.py).
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_num_seqs: int = Field(1024, gt=0)
    policy: Literal["fcfs", "priority"] = "fcfs"
    long_prefill_token_threshold: int = Field(0, ge=0)
    reserve_full_isl: bool = True  # vLLM >= 0.19: admission needs room for the whole prompt
    watermark: float = Field(0.0, ge=0.0, lt=1.0)  # fraction of blocks added to the admission need


class KVCacheConfig(StrictModel):
    # vLLM's FlashAttention backend (the default for these models on Hopper) takes block sizes that are
    # multiples of 16 only (FlashAttentionBackend.get_kv_cache_shape: "Block size must be a multiple of
    # 16"; get_supported_kernel_block_sizes: MultipleOf(16)); vLLM refuses anything else at start-up.
    block_size: int = Field(16, gt=0, multiple_of=16)
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = Field(0.92, gt=0.0, le=1.0)
    num_gpu_blocks: int | None = Field(None, gt=1)  # includes vLLM's reserved null block
    kv_cache_size_tokens: int | None = Field(None, gt=0)  # the server's "GPU KV cache size: N tokens"
    kv_bytes_per_token: int | None = Field(None, gt=0)  # override for transfer sizing (per GPU rank)
    cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    tiers: list[KVTierConfig] = Field(default_factory=list)  # tiers after host_offload (docs/kv-tiers.md)
    offload_prompt_only: bool = True
    """What the GPU offers to host_offload and the tiers: true, only prompt blocks (vLLM 0.33's
    default, ``kv_connector_extra_config.offload_prompt_only`` in v1/kv_offload/base.py; LMCache's
    ``save_decode_cache: false`` likewise); false, generated blocks too (docs/engine.md, "G2 host
    offload")."""

    @model_validator(mode="after")
    def _one_capacity(self) -> KVCacheConfig:
        if self.num_gpu_blocks is not None and self.kv_cache_size_tokens is not None:
            raise ValueError("give num_gpu_blocks or kv_cache_size_tokens, not both")
        return self


class LoadConfig(StrictModel):
    mode: Literal["trace_timestamps", "concurrency", "poisson"] = "trace_timestamps"
    speedup: float = Field(1.0, gt=0.0)  # trace_timestamps: arrival = timestamp / speedup
    concurrency: int | None = Field(None, gt=0)  # concurrency: requests in flight at once
    rate: float | None = Field(None, gt=0.0)  # poisson: requests per second
    max_requests: int | None = Field(None, gt=0)  # replay only the first N requests of the trace
    window: str | None = None  # "09:00-12:00": replay one slice of the trace (engine/load_window.py)

    @model_validator(mode="after")
    def _mode_fields(self) -> LoadConfig:
        if self.window is not None:
            parse_window(self.window)
        if self.mode == "concurrency" and self.concurrency is None:
            raise ValueError("load.mode=concurrency needs load.concurrency")
        if self.mode == "poisson" and self.rate is None:
            raise ValueError("load.mode=poisson needs load.rate (requests per second)")
        return self


class SpeculativeConfig(StrictModel):
    method: Literal["mtp"] = "mtp"
    num_speculative_tokens: int = Field(1, ge=1, le=8)
    acceptance_rates: list[float] | None = None  # conditional per-position rates a_1..a_k
    expected_accepted_tokens: float | None = Field(None, ge=0.0)  # E[accepted drafts per step]
    seed: int = 42
    drafter: Literal["model", "synthetic"] = "model"  # synthetic: costed as one extra target layer


class HostOffloadConfig(StrictModel):
    num_cpu_blocks: int | None = Field(None, gt=0)
    size_gib: float | None = Field(None, gt=0.0)
    block_size: int | None = Field(None, gt=0)  # offload block tokens; multiple of the GPU block size
    d2h_gbps: float = Field(50.0, gt=0.0)  # PCIe Gen5 x16 pinned, per direction (docs/timing.md)
    h2d_gbps: float = Field(50.0, gt=0.0)
    latency_us: float = Field(10.0, ge=0.0)  # per copy; spec says about 5-10 us
    eviction: Literal["lru"] = "lru"

    @model_validator(mode="after")
    def _one_size(self) -> HostOffloadConfig:
        if (self.num_cpu_blocks is None) == (self.size_gib is None):
            raise ValueError("host_offload needs exactly one of num_cpu_blocks or size_gib")
        return self


class TimingConfig(StrictModel):
    backend: Literal["roofline", "aic"] = "roofline"
    profile: str | None = None  # a calibrated profile YAML from `replay calibrate`
    host_overhead_ms: float | None = Field(None, ge=0.0)  # override the per-step host overhead
    mixed_layer_us: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    """Extra cost per layer, in us, of every step that carries a prefill chunk (mixed and prefill-only
    steps run attention outside the CUDA graph decode-only steps replay); overrides the hardware
    profile's or calibrated profile's value; unset: theirs (0 in every shipped profile). See
    docs/timing.md, "Mixed and prefill steps"."""
    aic_exact: bool = False
    """Backend aic only: true prices every distinct step with a direct aiconfigurator call, bit for
    bit; false (default) prices decode-only steps from segment lines fitted to aiconfigurator (exact
    to float rounding) and interpolation cells where its table is extrapolated (at most 1e-4
    relative, measured). See docs/timing.md, "How the aic backend stays fast"."""


class EngineConfig(StrictModel):
    model: str = "meta-llama/Llama-3.1-8B"
    hardware: str = "h200_sxm"
    tensor_parallel_size: int = Field(1, gt=0)
    dtype: Literal["bf16", "fp8"] = "bf16"  # weight dtype
    max_model_len: int | None = Field(None, gt=0)
    semantics: Literal["0.33", "0.11"] = "0.33"  # which vLLM version's scheduler rules to follow
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    kv_cache: KVCacheConfig = Field(default_factory=KVCacheConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    speculative: SpeculativeConfig | None = None
    host_offload: HostOffloadConfig | None = None
    timing: TimingConfig = Field(default_factory=TimingConfig)
    seed: int = 0
    fleet: FleetConfig | None = None  # absent: one replica, outputs exactly the single-engine ones

    @field_validator("semantics", mode="before")
    @classmethod
    def _version_as_text(cls, v: Any) -> Any:
        """YAML reads ``semantics: 0.33`` (and ``--set semantics=0.33``) as a float: take it as the version."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return repr(v)
        return v

    @model_validator(mode="after")
    def _clusters_need_open_loop(self) -> EngineConfig:
        if self.fleet is not None and self.fleet.clusters > 1 and self.load.mode == "concurrency":
            raise ValueError("fleet.clusters > 1 cannot replay load.mode=concurrency: its slots are shared "
                             "by the whole fleet, so the clusters would not be independent")
        return self

    @model_validator(mode="after")
    def _model_limits(self) -> EngineConfig:
        check_model_limits(self)
        return self

    @model_validator(mode="after")
    def _pool_configs(self) -> EngineConfig:
        """A disaggregated fleet's pools must each be a valid engine, with one model and block size."""
        if self.fleet is not None and self.fleet.disaggregated:
            block_sizes = {pool: self.pool_config(pool).kv_cache.block_size for pool in ("prefill", "decode")}
            if block_sizes["prefill"] != block_sizes["decode"]:
                raise ValueError(f"fleet.decode.kv_cache.block_size: the pools must share one KV block size "
                                 f"(prefill {block_sizes['prefill']}, decode {block_sizes['decode']}): vLLM's P/D "
                                 f"connectors copy whole blocks")
        return self

    def pool_config(self, pool: str) -> EngineConfig:
        """The engine config of one pool of a disaggregated fleet (``prefill`` or ``decode``): this
        config with the pool's overrides merged in, and no fleet section. ValueError names the key."""
        fleet = self.fleet
        spec = getattr(fleet, pool, None) if fleet is not None else None
        if spec is None:
            raise ValueError(f"fleet.{pool}: not a disaggregated fleet")
        data = self.model_dump(mode="python", exclude={"fleet"})
        for key, value in spec.overrides().items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        try:
            return EngineConfig.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            msg = "unknown key" if err["type"] == "extra_forbidden" else str(err.get("ctx", {}).get("error", err["msg"]))
            raise ValueError(f"fleet.{pool}.{loc}: {msg}" if loc else f"fleet.{pool}: {msg}") from None

    @model_validator(mode="after")
    def _tier_chain(self) -> EngineConfig:
        host = self.host_offload
        fleet = self.fleet
        if fleet is not None and fleet.disaggregated:  # refused whether or not the top level has tiers
            for pool in ("prefill", "decode"):
                spec = getattr(fleet, pool)
                if spec is not None and spec.kv_cache and "tiers" in spec.kv_cache:
                    raise ValueError(f"fleet.{pool}.kv_cache.tiers: the tiers are the fleet's, set at the top "
                                     f"level (kv_cache.tiers): a cluster tier is one store both pools share")
        if self.kv_cache.tiers:
            check_tier_chain(self.kv_cache.tiers, host is not None,
                             (host.block_size if host is not None else None) or self.kv_cache.block_size)
        fleet = self.fleet
        if fleet is not None and fleet.disaggregated and fleet.kv_transfer.decode_source == "cluster_tier" \
                and not any(t.scope == "cluster" for t in self.kv_cache.tiers):
            raise ValueError("fleet.kv_transfer.decode_source: cluster_tier needs a kv_cache.tiers entry with "
                             "scope: cluster to read from")
        weights = self.fleet.router_options.get("tier_weights") if self.fleet is not None else None
        if weights:
            names = ([HOST_OFFLOAD_TIER_NAME] if host is not None else []) + [t.name for t in self.kv_cache.tiers]
            for name in weights:
                if name not in names:
                    raise ValueError(f"fleet.router_options.tier_weights.{name}: no such KV tier (the chain has: "
                                     f"{', '.join(names) or 'none'})")
        return self

    def kv_cache_dtype(self) -> str:
        """The KV cache's element type: the weights' dtype unless ``kv_cache.cache_dtype`` names one."""
        return self.dtype if self.kv_cache.cache_dtype == "auto" else self.kv_cache.cache_dtype

    def num_kv_layers(self, model: ModelSpec) -> int:
        """Target layers, plus the MTP head's layers when it drafts (vLLM gives them KV cache too)."""
        if self.speculative is not None and self.speculative.drafter == "model":
            return model.num_layers + model.num_mtp_layers
        return model.num_layers

    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on one tensor-parallel rank, over all KV layers (vLLM's page
        size per token: ``kv_cache_utils``), unless ``kv_cache.kv_bytes_per_token`` gives it."""
        if self.kv_cache.kv_bytes_per_token is not None:
            return self.kv_cache.kv_bytes_per_token
        model = get_model(self.model)
        per_layer = model.kv_elems_per_token_per_layer(self.tensor_parallel_size) * DTYPE_BYTES[self.kv_cache_dtype()]
        return per_layer * self.num_kv_layers(model)


def check_model_limits(config: EngineConfig) -> None:
    """What vLLM refuses at start-up for this model and GPU (ValueError names the key).

    - ``tensor_parallel_size``: vLLM requires the attention heads to split evenly over the ranks
      (``ModelConfig.verify_with_parallel_config``: num_attention_heads % tp == 0) and the KV heads to
      split or replicate evenly (``QKVParallelLinear``: kv_heads % tp == 0, or tp % kv_heads == 0
      when tp > kv_heads). MLA models keep one latent per rank: only the first rule applies.
    - ``max_model_len`` above the model's ``max_position_embeddings``: vLLM refuses unless
      ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` (that override is not modeled).
    - ``kv_cache.num_gpu_blocks`` / ``kv_bytes_per_token``-sized ``kv_cache_size_tokens``: the KV cache
      of one rank cannot exceed that GPU's whole memory (the profile's ``usable_memory_bytes``, what
      the driver reports), which bounds it long before any int overflow.

    An unknown model or hardware is left to ``resolve_setup``, which names it.
    """
    try:
        model = get_model(config.model)
        hw = get_hardware(config.hardware)
    except ReplayError:
        return
    tp = config.tensor_parallel_size
    if model.num_q_heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} does not divide the {model.num_q_heads} attention heads of "
                         f"{model.name} (vLLM refuses this)")
    kv = model.num_kv_heads
    if not model.is_mla and kv and (kv % tp if tp <= kv else tp % kv):
        raise ValueError(f"tensor_parallel_size={tp} neither divides nor is a multiple of the {kv} KV heads of "
                         f"{model.name} (vLLM refuses this)")
    if config.max_model_len is not None and config.max_model_len > model.max_position_embeddings:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds {model.name}'s limit of "
                         f"{model.max_position_embeddings} tokens (max_position_embeddings; vLLM refuses this)")
    kvc = config.kv_cache
    tokens = (kvc.num_gpu_blocks * kvc.block_size if kvc.num_gpu_blocks is not None
              else kvc.kv_cache_size_tokens)
    if tokens is not None:
        need = tokens * config.kv_bytes_per_token()
        memory = int(hw.gpu.usable_memory_bytes.value)
        if need > memory:
            key = "num_gpu_blocks" if kvc.num_gpu_blocks is not None else "kv_cache_size_tokens"
            raise ValueError(f"kv_cache.{key}: {tokens:,} tokens of KV need {need / 2**30:,.1f} GiB per GPU, more "
                             f"than the {memory / 2**30:,.1f} GiB of a whole {hw.name}")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what YAML found wrong and where (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def _parse_scalar(text: str, item: str) -> Any:
    """Override values use YAML scalars: 8192, 0.5, true, null, fcfs, [0.8, 0.3]."""
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {item!r}: invalid YAML value ({_yaml_problem(exc)})") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (from ``--set``) to a config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. scheduler.max_num_seqs=256")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            if isinstance(node, list):  # a list of named entries (kv_cache.tiers): address one by name
                named = [e for e in node if isinstance(e, dict) and e.get("name") == part]
                if len(named) != 1:
                    raise ConfigError(f"--set {item!r}: no single entry named {part!r} in that list")
                node = named[0]
                continue
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, (dict, list)):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
            node = child
        if isinstance(node, list):
            raise ConfigError(f"--set {item!r}: {parts[-2]!r} is a list; name an entry, e.g. kv_cache.tiers.ssd.num_blocks")
        node[parts[-1]] = _parse_scalar(value, item)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> EngineConfig:
    """Load a YAML config (or the defaults), apply overrides, validate; errors name the file and key."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            require_regular_file(path, "config file")
            text = Path(path).read_text(encoding="utf-8")
        except ReplayError as exc:
            raise ConfigError(str(exc)) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset "
                              f"{exc.start}); a config is YAML text") from None
        try:
            loaded = load_yaml(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the config must be a mapping of keys to values")
        data = loaded
    return validate_config(data, source, overrides)


def validate_config(data: dict[str, Any], source: str, overrides: list[str] | None = None) -> EngineConfig:
    """Validate a config mapping (after ``--set`` overrides); errors list every bad key."""
    if overrides:
        data = apply_overrides(data, overrides)
        source += " + --set " + " ".join(overrides)
    try:
        return EngineConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] == "value_error":
                msg = str(err.get("ctx", {}).get("error", err["msg"]))
            else:
                msg = err["msg"]
            problems.append(f"{loc}: {msg}" if loc else msg)
        raise ConfigError(f"{source}: invalid config: " + "; ".join(problems)) from None
