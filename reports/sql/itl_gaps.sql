-- Inter-token latency samples (ms): one gap per output chunk after a request's first, pooled over
-- all finished requests (a step that emits several tokens under MTP is one chunk, so one gap).
-- Long outputs contribute more gaps: this is vLLM's pooled ITL, not a per-request mean.
-- The same samples as `time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER BY time_ms)`, at
-- about half the cost: each request's chunk times are gathered into one sorted list (a hash
-- aggregation, no sort of every chunk) and the gaps are the element-wise differences of the list
-- without its first and without its last element. Unfinished requests are dropped after the
-- aggregation (an ANTI JOIN of one row per request instead of one per chunk).
-- The body of the table macro itl_gaps_part(parts, part): the requests whose request_id hashes to
-- `part` modulo `parts`. Every request is in exactly one part, so the parts' samples together are
-- the view itl_gaps (= itl_gaps_part(1, 0), no filter); itl_samples.sql builds them part by part on
-- large runs, so the per-request lists of one part at a time are in memory (DuckDB cannot spill a
-- list aggregate's states: 220 M chunk rows in one aggregation fail under a 1 GB limit).
SELECT later - earlier AS itl_ms
FROM (
    SELECT unnest(list_slice(times, 2, len(times)))     AS later,
           unnest(list_slice(times, 1, len(times) - 1)) AS earlier
    FROM (SELECT request_id, list_sort(list(time_ms)) AS times FROM chunks
          WHERE parts = 1 OR hash(request_id) % parts = part
          GROUP BY request_id) AS per_request
    ANTI JOIN (SELECT request_id FROM requests WHERE status <> 'finished') AS unfinished USING (request_id)
)
