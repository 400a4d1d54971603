-- Per trace row: prompt tokens an infinite prefix cache would hit. Rows are taken in arrival order
-- (ties by file row); a row hits the leading run of its hash ids that appeared in any earlier row,
-- k ids -> min(k * hash_block_size, input_tokens). A row's own earlier ids do not count: the cache is
-- looked up before the row's blocks are inserted. Rows without hash ids hit nothing.
CREATE OR REPLACE TEMP TABLE trace_ideal AS
WITH t AS (
    SELECT row_number() OVER (ORDER BY arrival_ms, trace_row) AS rn,
           request_id, turn, input_tokens, hash_ids
    FROM trace_rows
),
ids AS (
    SELECT rn, unnest(hash_ids) AS h, generate_subscripts(hash_ids, 1) AS pos
    FROM t
),
-- Each id's first use, (row, position) packed into one BIGINT ordered as the pair (positions and
-- rows stay below 2^32 and 2^31), so one min() finds the first row and the id's first position in
-- it: no join of the 8M-row id list back onto the first uses.
first_use AS (
    SELECT min(rn * 4294967296 + pos) AS first_key FROM ids GROUP BY h
),
-- A row's first miss: the smallest position of an id the row is the first to use.
first_miss AS (
    SELECT first_key // 4294967296 AS rn, min(first_key % 4294967296) AS pos FROM first_use GROUP BY ALL
)
SELECT
    t.request_id,
    t.turn,
    t.input_tokens,
    least(coalesce(first_miss.pos - 1, len(t.hash_ids), 0) * (SELECT hash_block_size FROM trace_meta),
          t.input_tokens)::BIGINT AS ideal_hit_tokens
FROM t LEFT JOIN first_miss USING (rn)
