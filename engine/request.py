"""A request as the scheduler sees it, with vLLM's vocabulary (num_computed_tokens, num_tokens...).

Token contents are never materialised: a request knows its lengths and a `BlockKeys` object that
names each full KV block by the identity of the prefix it ends (see block_keys.py).
"""

from __future__ import annotations

from enum import IntEnum

from replay.engine.block_keys import BlockKeys


class RequestStatus(IntEnum):
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1  # a KV load is in flight: G2's H2D copy or a P/D transfer (vLLM's name)
    RUNNING = 2
    PREEMPTED = 3
    FINISHED = 4


class Request:
    """Per-request state. ``num_tokens`` = prompt + generated tokens (drafts excluded)."""

    __slots__ = (
        "idx", "request_id", "session_id", "turn", "priority", "arrival_ms",
        "num_prompt_tokens", "max_tokens", "num_output_tokens", "num_computed_tokens",
        "num_draft_tokens", "status", "keys", "block_ids", "num_cached_blocks",
        "num_cached_tokens", "num_cpu_hit_tokens", "num_preemptions",
        "first_scheduled_ms", "first_token_ms", "finish_ms", "load_wait_ms", "load_ready_ms",
        "load_start_ms", "num_drafts", "num_draft_tokens_total", "num_accepted_tokens",
        "spec_step", "stores_done_ms", "num_stored_offload_blocks",
        "load_keys", "lookup_memo", "is_prefill_chunk", "padded_drafts",
        "do_remote_prefill", "do_remote_decode", "remote_loading",
        "tier_hit_tokens", "tier_loads",
        "run_replica", "run_first_step", "run_steps", "run_tokens",
    )

    def __init__(self, idx: int, request_id: str, arrival_ms: float, num_prompt_tokens: int,
                 max_tokens: int, keys: BlockKeys, session_id: str | None = None,
                 turn: int | None = None, priority: int = 0) -> None:
        self.idx = idx
        self.request_id = request_id
        self.session_id = session_id
        self.turn = turn
        self.priority = priority
        self.arrival_ms = arrival_ms
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_draft_tokens = 0  # drafts proposed for the next step (MTP)
        self.status = RequestStatus.WAITING
        self.keys = keys
        self.block_ids: list[int] = []
        self.num_cached_blocks = 0  # leading blocks of block_ids already registered in the prefix cache
        self.num_cached_tokens = -1  # GPU prefix hit tokens, recorded once at first admission
        self.num_cpu_hit_tokens = -1  # G2 hit tokens, recorded once at first admission
        self.num_preemptions = 0
        self.first_scheduled_ms = -1.0
        self.first_token_ms = -1.0
        self.finish_ms = -1.0
        self.load_wait_ms = 0.0
        self.load_ready_ms = 0.0
        self.load_start_ms = 0.0
        self.num_drafts = 0
        self.num_draft_tokens_total = 0
        self.num_accepted_tokens = 0
        self.spec_step = 0  # how many verification steps this request has had (seeds acceptance draws)
        self.stores_done_ms = 0.0  # G2: when the last D2H store reading this request's blocks completes
        self.num_stored_offload_blocks = 0  # leading offload blocks already prepared for storing
        self.load_keys: list[range] = []  # G2: runs of CPU keys pinned by this request's H2D load
        self.is_prefill_chunk = False  # vLLM: its last scheduled chunk ended before its last known token
        self.padded_drafts = False  # vLLM pad_spec_decode: this step's drafts are placeholders
        # P/D (vLLM's kv_transfer_params): on a prefill replica, do_remote_decode keeps the finished
        # request's blocks for the decode replica to read; on a decode replica, do_remote_prefill
        # reads the prompt's KV instead of computing it (cleared once the read starts: remote_loading).
        self.do_remote_prefill = False
        self.do_remote_decode = False
        self.remote_loading = False
        self.tier_hit_tokens: list[int] | None = None  # KV tiers: hit tokens per tier at first admission
        self.tier_loads: list = []  # KV tiers: the parts of the load in flight (engine/kv_tiers.py TierLoad)
        # The open run of this request's output chunks (engine/recorder.py): chunks of ``run_tokens``
        # tokens at the ends of steps run_first_step .. run_first_step + run_steps - 1 of replica
        # run_replica (run_steps 0: none open).
        self.run_replica = 0
        self.run_first_step = 0
        self.run_steps = 0
        self.run_tokens = 0
        self.lookup_memo: tuple | None = None  # G2: (store version, ready bound, start, hits, blocks, key runs, their groups, a copy pending) of the last lookup

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Request({self.request_id!r}, computed={self.num_computed_tokens}, "
                f"tokens={self.num_tokens}, out={self.num_output_tokens}, status={self.status.name})")
