"""Name each engine KV block by the identity of the token prefix it ends, without tokens.

vLLM hashes a full block as H(parent_hash, block tokens), so a block hash names the whole prefix
up to the block's end. Traces give the same kind of chained identity at their own granularity
(`hash_block_size` tokens per id, e.g. 512 for Mooncake): trace id i names the first
(i + 1) * HB tokens, and the last id names the whole (possibly partial) last trace block.

So the first t tokens of a prompt (t <= input_tokens) are named by (id of the trace block holding
token t - 1, offset of t inside it). Two requests share that name exactly when they share that
trace block, which by chaining means they share the whole prefix. This is exact at trace-block
granularity; finer sharing inside a trace block is unknowable from the trace (a documented limit).

Tokens the trace has no identity for (generated tokens, prompts without hash ids) get keys unique
to the request, so only the request itself can hit them again (after a preemption).

With MTP under vLLM 0.33 each block hash also covers the next ``lookahead`` tokens: block j is
named by the prefix of (j + 1) * B + lookahead tokens.
"""

from __future__ import annotations

from typing import Final

_OFFSET_BITS: Final = 24  # offsets inside a trace block (hash_block_size < 2**24 tokens)
_UNIQUE_BITS: Final = 40  # token positions inside one request (< 2**40 tokens)
# A key is id * ID_STRIDE + offset (and -(tag * _TAG_STRIDE + t) - 1 for unique keys), not the bit
# concatenation (id << 24) | offset: the same order and the same differences inside a group, but the
# id also lands in the low bits. Python hashes an int to itself and a dict picks its first slot from
# the low bits, where block offsets (multiples of the block size, at most 2**24) leave concatenated
# keys only a few dozen distinct slots; every lookup then probes several times (measured: 58 -> 35 ns
# per lookup on 55,000 cached keys; the prefix-cache map, the G2 store and the routers' indexes all
# look keys up).
# Final, and spelled out: compiled code then uses the constants inline, not as module globals.
ID_STRIDE: Final = (1 << 24) + 1  # (1 << _OFFSET_BITS) + 1
_TAG_STRIDE: Final = (1 << 40) + 1  # (1 << _UNIQUE_BITS) + 1


class BlockKeys:
    """Block keys for one request. Keys are plain ints (fast dict keys); unique keys are negative."""

    __slots__ = ("ids", "start", "hash_block_size", "block_size", "input_tokens",
                 "unique_tag", "lookahead", "_memo", "shared_blocks", "_runs", "_runs_end")

    def __init__(self, ids: list[int], start: int, end: int, hash_block_size: int | None,
                 block_size: int, input_tokens: int, unique_tag: int, lookahead: int = 0,
                 shared_ids: int | None = None) -> None:
        self.ids = ids  # shared flat list of every row's ids; this request's are ids[start:end]
        self.start = start
        self.hash_block_size = hash_block_size or 0
        self.block_size = block_size
        self.input_tokens = input_tokens if end > start and hash_block_size else 0
        self.unique_tag = unique_tag
        self.lookahead = lookahead
        self._memo: list[int] = []  # keys of blocks 0..len-1, computed once, sliced after
        # key_runs(0, _runs_end, block_size), kept: the prefix cache asks for parts of it several
        # times per request (lookup, hits, registration, free), and cutting whole runs out of a
        # list is cheaper than building them again (a range() is a generic call, compiled too)
        self._runs: list[range] = []
        self._runs_end = 0
        # Leading blocks whose keys another request could also hold: those ending inside the first
        # ``shared_ids`` trace blocks (ids that occur in other rows; all of them when not given).
        # Keys past them (unique ids, generated tokens) can only ever be looked up by this request.
        if shared_ids is None:
            shared_ids = end - start
        shared_tokens = min(shared_ids * self.hash_block_size, self.input_tokens)
        self.shared_blocks = max(0, (shared_tokens - lookahead) // block_size)

    def keys_upto(self, j1: int) -> list[int]:
        """Keys of blocks 0..j1-1, memoised: the GPU cache, the G2 tier and frees all ask for them."""
        memo = self._memo
        if j1 > len(memo):
            memo.extend(self.block_keys(len(memo), j1))
        return memo

    def prefix_key(self, t: int) -> int:
        """Identity of the first ``t`` tokens (t >= 1) of this request."""
        if t <= self.input_tokens:
            hb = self.hash_block_size
            i = (t - 1) // hb
            return self.ids[self.start + i] * ID_STRIDE + (t - i * hb)
        return -(self.unique_tag * _TAG_STRIDE + t) - 1

    def block_keys(self, j0: int, j1: int) -> list[int]:
        """Keys of blocks j0..j1-1 (each must be full, lookahead included), as one flat list."""
        out: list[int] = []
        for run in self.key_runs(j0, j1, self.block_size):
            out.extend(run)
        return out

    def key_runs(self, j0: int, j1: int, bs: int) -> list[range]:
        """Keys of blocks j0..j1-1 of ``bs`` tokens, as arithmetic runs in prefix order.

        Block j is named by the prefix of t_j = (j + 1) * bs + lookahead tokens. While t_j stays in
        one trace block, the keys form an arithmetic run (step bs), so each trace block costs one
        range() instead of a Python iteration per block. Every run lies in one ``key_group`` and
        steps by +bs (trace-named keys) or -bs (unique keys). ``bs`` is the GPU block size for the
        GPU cache and the offload block size for the G2 tier (an offload block is named by its last
        GPU block, i.e. by the same prefix). At the GPU block size, runs from block 0 are kept
        and later calls inside them are cut from them (the same keys and steps; only a cut run's
        ``stop`` may differ, which nothing reads).
        """
        if j1 <= j0:
            return []
        if bs == self.block_size:
            if j1 <= self._runs_end:
                return runs_slice(self._runs, j0, j1)
            if j0 == 0:
                runs = self._key_runs(0, j1, bs)
                self._runs = runs
                self._runs_end = j1
                return list(runs)  # the kept list is never handed out
        return self._key_runs(j0, j1, bs)

    def _key_runs(self, j0: int, j1: int, bs: int) -> list[range]:
        la = self.lookahead
        out: list[range] = []
        j = j0
        hb = self.hash_block_size
        if self.input_tokens:
            split = min(j1, max(0, (self.input_tokens - la) // bs))  # blocks named by trace ids
            ids, start = self.ids, self.start
            while j < split:
                i = ((j + 1) * bs + la - 1) // hb  # trace block holding the block's last token
                last = min(split, ((i + 1) * hb - la) // bs)  # first j past this trace block
                base = ids[start + i] * ID_STRIDE - i * hb + la
                out.append(range(base + (j + 1) * bs, base + last * bs + 1, bs))
                j = last
        if j < j1:
            neg = -self.unique_tag * _TAG_STRIDE - 1 - la  # -(tag * stride + t) - 1 == neg' - t
            out.append(range(neg - (j + 1) * bs, neg - j1 * bs - 1, -bs))
        return out


def key_group(key: int) -> int:
    """The group a key belongs to: its trace id, or (unique keys) its request tag, made negative.

    Keys of one group that are one block apart differ by exactly the block size, so a group's keys
    held anywhere form disjoint arithmetic intervals (what the G2 run store indexes by).
    """
    return key // ID_STRIDE if key >= 0 else key // _TAG_STRIDE


def runs_slice(runs: list[range], i0: int, i1: int) -> list[range]:
    """Positions i0..i1-1 of the concatenated runs, still as runs (a run wholly inside is itself)."""
    out: list[range] = []
    if i1 <= i0:
        return out
    pos = 0
    for run in runs:
        n = len(run)
        end = pos + n
        if end > i0 and pos < i1:
            if pos >= i0 and end <= i1:
                out.append(run)
            else:  # run[a:b], built from its fields (slicing a range is a generic call)
                a = i0 - pos if i0 > pos else 0
                b = i1 - pos if end > i1 else n
                step = run.step
                out.append(range(run.start + a * step, run.start + b * step, step))
        pos = end
        if pos >= i1:
            break
    return out
