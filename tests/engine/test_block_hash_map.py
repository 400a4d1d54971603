"""The prefix-cache map (engine/block_hash_map.py) on its own: 4-token blocks, hand-checked slots.

A trace-named key is trace id * ID_STRIDE + offset (engine/block_keys.py); with 4-token blocks the
key at offset o of trace id g lives in table g * 4 + o % 4, slot o // 4.
"""

from __future__ import annotations

from replay.engine.block_hash_map import BlockHashToBlockMap, cached_prefix_lens_of, count_equal
from replay.engine.block_keys import ID_STRIDE


def _key(trace_id: int, offset: int) -> int:
    return trace_id * ID_STRIDE + offset


def _run(trace_id: int, first: int, last: int) -> range:
    """Keys of trace id at offsets first, first + 4, ..., last (one BlockKeys.key_runs run)."""
    return range(_key(trace_id, first), _key(trace_id, last) + 1, 4)


def test_count_equal():
    assert count_equal([0, 3, 0, 3, 3], 1, 5, 3) == 3
    assert count_equal([0, 3, 0, 3, 3], 0, 3, 0) == 2
    assert count_equal([1], 1, 1, 1) == 0


def test_a_key_has_one_slot():
    hash_map = BlockHashToBlockMap(4)
    assert hash_map.slot_of(_key(3, 8)) == (12, 2)
    assert hash_map.slot_of(_key(3, 4)) == (12, 1)
    assert hash_map.slot_of(_key(3, 9)) == (13, 2)
    assert hash_map.slot_of(_key(0, 1)) == (1, 0)


def test_insert_and_look_up():
    hash_map = BlockHashToBlockMap(4)
    assert hash_map.insert(_key(3, 8), 7)
    table = hash_map.tables[12]
    assert (table.blocks, table.ref_counts, table.free_run_ids, table.num_filled) == ([0, 0, 7], [0, 0, 1], [0, 0, 0], 1)
    assert hash_map.get_one_block(_key(3, 8)) == 7
    assert hash_map.get_one_block(_key(3, 4)) is None  # an empty slot
    assert hash_map.get_one_block(_key(3, 12)) is None  # past the table
    assert hash_map.get_one_block(_key(4, 8)) is None  # no table
    assert not hash_map.insert(_key(3, 8), 9)  # mapped already: 9 would be a further copy
    assert hash_map.insert(-5, 11) and not hash_map.insert(-5, 12)  # a key unique to a request
    assert hash_map.get_one_block(-5) == 11 and hash_map.unique == {-5: 11}
    assert hash_map.num_keys() == 2
    assert sorted(hash_map.items()) == [(-5, 11), (_key(3, 8), 7)]


def test_a_trace_block_run_is_one_slice_and_a_second_computation_makes_further_copies():
    hash_map = BlockHashToBlockMap(4)
    run = _run(2, 4, 20)  # 5 keys, slots 1..5 of table 8
    hash_map.insert_all([11, 12, 13, 14, 15], [run])
    table = hash_map.tables[8]
    assert table.blocks == [0, 11, 12, 13, 14, 15] and table.ref_counts == [0, 1, 1, 1, 1, 1]
    assert table.num_filled == 5
    hash_map.insert_all([21, 22, 23, 24, 25, 26], [run, range(-7, -8, -1)])
    assert table.blocks == [0, 11, 12, 13, 14, 15]  # the first copies stay
    assert hash_map.further_copies == {k: [b] for k, b in zip(run, [21, 22, 23, 24, 25])}
    assert hash_map.get_one_block(-7) == 26
    assert hash_map.cached_prefix([run, range(-7, -8, -1)]) == [11, 12, 13, 14, 15, 26]


def test_popping_trims_trailing_empty_slots_and_drops_an_empty_table():
    hash_map = BlockHashToBlockMap(4)
    hash_map.insert_all([5, 6, 7], [_run(2, 4, 12)])  # slots 1..3 of table 8
    table = hash_map.tables[8]
    hash_map.pop(_key(2, 12))
    assert table.blocks == [0, 5, 6] and table.num_filled == 2
    hash_map.pop(_key(2, 4))  # a hole in the middle stays
    assert table.blocks == [0, 0, 6] and len(table.ref_counts) == len(table.free_run_ids) == 3
    hash_map.pop(_key(2, 8))
    assert hash_map.tables == {} and hash_map.num_keys() == 0


def test_pop_all_unmaps_a_descending_run_and_unique_keys():
    hash_map = BlockHashToBlockMap(4)
    hash_map.insert_all([1, 2, 3, 4, 5, 6, 9], [_run(2, 4, 24), range(-7, -8, -1)])
    hash_map.pop_all([_key(2, o) for o in (24, 20, 16, 12, 8)])  # eviction order: last first
    table = hash_map.tables[8]
    assert table.blocks == [0, 1] and table.num_filled == 1
    hash_map.pop_all([-7, _key(2, 4)])
    assert hash_map.tables == {} and hash_map.unique == {}


def test_a_prefix_walk_stops_at_the_first_unmapped_key():
    hash_map = BlockHashToBlockMap(4)
    run = _run(2, 4, 16)
    hash_map.insert_all([1, 2, 3, 4], [run])
    hash_map.insert(-7, 9)
    both = [run, range(-7, -8, -1)]
    assert hash_map.cached_prefix(both) == [1, 2, 3, 4, 9]
    hash_map.pop(_key(2, 8))
    assert hash_map.cached_prefix(both) == [1]
    assert hash_map.cached_prefix([_run(2, 12, 16)]) == [3, 4]
    assert hash_map.cached_prefix([_run(5, 4, 8)]) == []
    for runs in (both, [_run(2, 12, 16)], [_run(5, 4, 8)], [_run(2, 4, 24)]):
        assert hash_map.cached_prefix_len(runs) == len(hash_map.cached_prefix(runs))


def test_a_further_copy_takes_over_a_slot_with_its_count_or_run_id():
    hash_map = BlockHashToBlockMap(4)
    hash_map.insert_all([1, 2], [_run(2, 4, 8)])
    table = hash_map.tables[8]
    hash_map.replace_first_copy(_key(2, 4), 7, 2, 0)  # 7 is in use, held twice
    hash_map.replace_first_copy(_key(2, 8), 8, 0, 5)  # 8 is free, in free-queue run 5
    assert (table.blocks, table.ref_counts, table.free_run_ids) == ([0, 7, 8], [0, 2, 0], [0, 0, 5])
    hash_map.insert(-3, 4)
    hash_map.replace_first_copy(-3, 6, 0, 0)
    assert hash_map.unique == {-3: 6}


def test_many_maps_answer_as_each_walks_alone():
    """cached_prefix_lens_of (a router asking every replica) gives each map's own prefix count, on
    random fills and evictions, for runs across trace blocks, partial runs and unique keys."""
    import random

    rng = random.Random(5)
    for _ in range(60):
        maps = [BlockHashToBlockMap(4) for _ in range(4)]
        block = 1
        for m in maps:
            for _ in range(rng.randrange(6)):
                g, first = rng.randrange(3), 4 * rng.randrange(4)
                last = first + 4 * rng.randrange(4)
                run = _run(g, first, last)
                m.insert_all(list(range(block, block + len(run))), [run])
                block += len(run)
            if rng.random() < 0.5:  # a key unique to one request, cached here
                m.insert(-3, block)
                block += 1
            for _ in range(rng.randrange(3)):
                key = _key(rng.randrange(3), 4 * rng.randrange(7))
                if m.get_one_block(key) is not None:
                    m.pop(key)
        for _ in range(10):
            runs = [_run(g, 4 * a, 4 * (a + rng.randrange(4))) for g, a in
                    ((rng.randrange(3), rng.randrange(4)) for _ in range(rng.randrange(1, 4)))]
            if rng.random() < 0.4:
                runs.insert(rng.randrange(len(runs) + 1), range(-3, -4, -1))
            assert cached_prefix_lens_of(maps, runs) == [m.cached_prefix_len(runs) for m in maps]
            assert cached_prefix_lens_of(maps, runs) == [len(m.cached_prefix(runs)) for m in maps]


def _index_from_scratch(maps) -> dict:
    """What a WholeTableIndex over ``maps`` must hold: per table, per length, the whole tables' bits."""
    whole: dict = {}
    for m in maps:
        for tid, table in m.tables.items():
            n = len(table.blocks)
            filled = n - table.blocks.count(0)
            key = 2 * n if filled == n else 2 * n + 1 if filled == n - 1 and not table.blocks[0] else 0
            if key:
                by_len = whole.setdefault(tid, {})
                by_len[key] = by_len.get(key, 0) | m.index_bit
    return whole


def test_a_fleet_index_of_whole_tables_answers_as_each_map_walks_alone():
    """Maps joined to one WholeTableIndex: a router's question is answered from the index where every
    table a run reads is whole, and from each map's own tables where it drops out. Hand-checked first
    (map 0 holds trace block 1 whole, map 1 with a hole, map 2 not at all), then random fills and
    evictions checked against each map's own walk and the index against a recount."""
    import random

    from replay.engine.whole_table_index import WholeTableIndex

    index = WholeTableIndex()
    maps = [BlockHashToBlockMap(4) for _ in range(3)]
    for m in maps:
        m.join_index(index)
    maps[0].insert_all([1, 2, 3, 4], [_run(1, 0, 12)])
    maps[1].insert_all([5, 6, 7, 8], [_run(1, 0, 12)])
    maps[1].pop(_key(1, 8))
    runs = [_run(1, 0, 12), _run(2, 0, 4)]
    assert cached_prefix_lens_of(maps, runs) == [4, 2, 0]
    assert index.whole == {4: {8: 0b001}}  # table 1 * 4 + 0: whole in map 0 only, 4 slots (key 2 * 4)
    maps[1].insert(_key(1, 8), 9)  # the hole filled: map 1's table is whole too
    assert index.whole == {4: {8: 0b011}}
    maps[0].pop_all([_key(1, 12), _key(1, 8), _key(1, 4), _key(1, 0)])  # evicted, table dropped
    assert index.whole == {4: {8: 0b010}}
    # A table of offsets 4, 8, 12 (slot 0, offset 0, empty): whole for runs that do not read slot 0
    maps[2].insert_all([20, 21, 22], [_run(3, 4, 12)])
    assert index.whole[12] == {9: 0b100}
    assert cached_prefix_lens_of(maps, [_run(3, 4, 12)]) == [0, 0, 3]
    assert cached_prefix_lens_of(maps, [_run(3, 0, 12)]) == [0, 0, 0]
    assert cached_prefix_lens_of(maps, runs) == [0, 4, 0]

    rng = random.Random(7)
    for _ in range(40):
        index = WholeTableIndex()
        maps = [BlockHashToBlockMap(4) for _ in range(5)]
        for m in maps:
            m.join_index(index)
        block = 1
        for _ in range(40):
            m = rng.choice(maps)
            action = rng.random()
            if action < 0.45:
                g, first = rng.randrange(3), 4 * rng.randrange(4)
                run = _run(g, first, first + 4 * rng.randrange(5))
                m.insert_all(list(range(block, block + len(run))), [run])
                block += len(run)
            elif action < 0.55:
                m.insert(-3, block)
                block += 1
            elif action < 0.8:
                key = _key(rng.randrange(3), 4 * rng.randrange(8))
                if m.get_one_block(key) is not None and key not in m.further_copies:
                    m.pop(key)
            else:  # a trace block's tail evicted at once, last first
                g, top = rng.randrange(3), rng.randrange(8)
                keys = [_key(g, 4 * o) for o in range(top, -1, -1)]
                keys = keys[:next((j for j, k in enumerate(keys) if m.get_one_block(k) is None
                                   or k in m.further_copies), len(keys))]
                m.pop_all(keys)
            assert index.whole == _index_from_scratch(maps)
            runs = [_run(g, 4 * a, 4 * (a + rng.randrange(4))) for g, a in
                    ((rng.randrange(3), rng.randrange(4)) for _ in range(rng.randrange(1, 4)))]
            if rng.random() < 0.3:
                runs.insert(rng.randrange(len(runs) + 1), range(-3, -4, -1))
            assert cached_prefix_lens_of(maps, runs) == [m.cached_prefix_len(runs) for m in maps]
            some = rng.sample(maps, 3)  # a router may ask some of the fleet (in any order)
            assert cached_prefix_lens_of(some, runs) == [m.cached_prefix_len(runs) for m in some]
