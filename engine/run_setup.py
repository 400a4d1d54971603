"""What a config resolves to before a replay starts: KV capacity, model length limit, step timer.

Resolved once per run (and once per sweep config); errors name the config key. Both the run and
run.json's assembly (run_info.py) read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from replay.engine.config import EngineConfig
from replay.engine.kv_capacity import resolve_num_gpu_blocks
from replay.engine.models import get_model
from replay.engine.timing import build_timer
from replay.engine.timing.base import StepTimer


@dataclass
class EngineSetup:
    """Everything derived from the config before the run: capacity, limits, timer."""

    num_gpu_blocks: int
    capacity_source: str
    max_model_len: int
    timer: StepTimer
    kv_bytes_per_token: int
    uncalibrated: list[str] = field(default_factory=list)
    capacity_detail: dict = field(default_factory=dict)


def resolve_setup(config: EngineConfig) -> EngineSetup:
    """Model, KV capacity and step timer for a config (errors name the config key). A disaggregated
    fleet's setup is its decode pool's, where requests complete (engine/pd_run.py resolves both)."""
    if config.fleet is not None and config.fleet.disaggregated:
        config = config.pool_config("decode")
    model = get_model(config.model)
    cap = resolve_num_gpu_blocks(config)
    timer = build_timer(config)
    max_model_len = config.max_model_len or int(model.max_position_embeddings)
    # The per-step host overhead is a guess (docs/timing.md) unless the user set it or fitted it.
    user_set = config.timing.host_overhead_ms is not None or config.timing.profile is not None
    uncal = [] if user_set else ["host_overhead_ms"]
    detail = {k: v for k, v in asdict(cap).items() if k not in ("num_gpu_blocks", "source") and v is not None}
    return EngineSetup(num_gpu_blocks=int(cap.num_gpu_blocks), capacity_source=str(cap.source),
                       max_model_len=max_model_len, timer=timer,
                       kv_bytes_per_token=int(config.kv_bytes_per_token()), uncalibrated=uncal,
                       capacity_detail=detail)
