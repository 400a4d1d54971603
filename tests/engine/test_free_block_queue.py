"""The free-block queue (engine/free_block_queue.py) on its own: tiny queues, hand-checked orders."""

from __future__ import annotations

from replay.engine.free_block_queue import AnonymousRun, FreeKVCacheBlockQueue


def _runs(queue: FreeKVCacheBlockQueue) -> list[tuple]:
    """The queue, head first: (run id, count, counts_as_eviction) for an anonymous run, (run id,
    blocks, head, num_stale, num_off_table) for a registered one."""
    out: list[tuple] = []
    for rid, run in queue.runs.items():
        if isinstance(run, AnonymousRun):
            out.append((rid, run.count, run.counts_as_eviction))
        else:
            out.append((rid, list(run.blocks), run.head, run.num_stale, run.num_off_table))
    return out


def test_a_new_queue_is_one_uncached_run_of_every_block():
    queue = FreeKVCacheBlockQueue(7)
    assert _runs(queue) == [(0, 7, False)]
    assert queue.next_run_id == 1 and queue.run_id_of_block == {}


def test_anonymous_blocks_merge_into_a_neighbour_run_of_the_same_kind():
    queue = FreeKVCacheBlockQueue(10)
    queue.append_anonymous(3, False)  # uncached, at the tail: the tail run is uncached too
    assert _runs(queue) == [(0, 13, False)]
    queue.append_anonymous(2, True)  # private (an eviction when taken): a run of its own
    queue.append_anonymous(4, True)
    assert _runs(queue) == [(0, 13, False), (1, 6, True)]
    queue.prepend_uncached(5)  # the head run is uncached: merged there
    assert _runs(queue) == [(0, 18, False), (1, 6, True)]
    queue.append_anonymous(1, False)  # the tail is private: a new run
    assert _runs(queue) == [(0, 18, False), (1, 6, True), (2, 1, False)]
    assert queue.next_run_id == 3


def test_uncached_blocks_go_before_a_head_that_is_not_uncached():
    queue = FreeKVCacheBlockQueue(4)
    queue.append_anonymous(2, True)
    del queue.runs[0]  # allocation took the 4 uncached blocks
    queue.prepend_uncached(3)
    assert _runs(queue) == [(2, 3, False), (1, 2, True)]


def test_a_registered_run_records_its_off_table_blocks():
    queue = FreeKVCacheBlockQueue(2)
    rid = queue.next_run_id
    queue.append_registered(rid, [5, 6, 7, 8], [50, 60, -70, 80], [7])  # 7's key is unique: off the tables
    assert _runs(queue) == [(0, 2, False), (1, [5, 6, 7, 8], 0, 0, 1)]
    assert queue.run_id_of_block == {7: 1} and queue.next_run_id == 2
    queue.append_anonymous(1, False)  # after a registered run, uncached blocks at the tail are a new run
    assert list(queue.runs) == [0, 1, 2]


def test_hits_make_entries_stale_and_a_run_leaves_once_nothing_in_it_is_free():
    queue = FreeKVCacheBlockQueue(2)
    queue.append_registered(1, [5, 6, 7, 8], [50, 60, -70, 80], [7])
    run = queue.runs[1]
    assert not isinstance(run, AnonymousRun)
    queue.remove_from_run(1, 2)  # a hit on 5 and 6 (first copies: their run id is in their slots)
    assert (run.num_stale, run.num_live()) == (2, 2)
    assert queue.remove_off_table(7)  # a hit on 7
    assert (run.num_stale, run.num_live()) == (3, 1) and queue.run_id_of_block == {}
    assert not queue.remove_off_table(7)  # not free any more
    queue.remove_from_run(1, 1)  # a hit on 8: the run has no free block left
    assert _runs(queue) == [(0, 2, False)]


def test_a_run_allocation_has_started_leaves_when_the_rest_is_hit():
    queue = FreeKVCacheBlockQueue(0)
    queue.append_registered(1, [5, 6, 7], [50, 60, 70], [])
    run = queue.runs[1]
    assert not isinstance(run, AnonymousRun)
    run.head = 1  # allocation took 5
    queue.remove_from_run(1, 1)
    assert (run.num_stale, run.num_live()) == (1, 1) and 1 in queue.runs
    queue.remove_from_run(1, 1)
    assert 1 not in queue.runs
