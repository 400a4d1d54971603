-- Prefix reuse with an infinite prefix cache on every replica, given this run's routing: a row hits
-- the leading run of its hash ids that an earlier row routed to the same replica used
-- (trace_ideal.sql restricted to each replica's rows). Between the run's reuse and the trace's ideal
-- (one infinite cache for all rows), it separates what routing costs from what eviction costs.
-- A replica here is the prefix cache a prompt was looked up in (the request_caches view: in a
-- disaggregated fleet, its prefill replica's).
WITH routed AS (
    SELECT t.request_id, t.arrival_ms, t.trace_row, t.input_tokens, t.hash_ids, c.cache
    FROM trace_rows t JOIN requests r USING (request_id) JOIN request_caches c USING (request_id)
    WHERE r.status <> 'rejected'
),
t AS (
    SELECT row_number() OVER (ORDER BY arrival_ms, trace_row) AS rn, cache, input_tokens, hash_ids
    FROM routed
),
ids AS (
    SELECT rn, cache, unnest(hash_ids) AS h, generate_subscripts(hash_ids, 1) AS pos
    FROM t
),
first_use AS (
    SELECT min(rn * 4294967296 + pos) AS first_key FROM ids GROUP BY cache, h
),
first_miss AS (
    SELECT first_key // 4294967296 AS rn, min(first_key % 4294967296) AS pos FROM first_use GROUP BY ALL
),
per_row AS (
    SELECT
        t.input_tokens,
        least(coalesce(first_miss.pos - 1, len(t.hash_ids), 0) * (SELECT hash_block_size FROM trace_meta),
              t.input_tokens)::BIGINT AS hit_tokens
    FROM t LEFT JOIN first_miss USING (rn)
)
SELECT
    coalesce(sum(hit_tokens), 0)                        AS routed_ideal_hit_tokens,
    coalesce(sum(input_tokens), 0)                      AS prompt_tokens,
    sum(hit_tokens) / nullif(sum(input_tokens), 0)      AS routed_ideal_hit_ratio
FROM per_row
