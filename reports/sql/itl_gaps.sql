-- Inter-token latency samples (ms): one gap per output chunk after a request's first, pooled over
-- all finished requests (a step that emits several tokens under MTP is one chunk, so one gap).
-- Long outputs contribute more gaps: this is vLLM's pooled ITL, not a per-request mean.
-- The ANTI JOIN against the (small) set of unfinished requests is much cheaper than NOT IN.
SELECT time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER BY time_ms) AS itl_ms
FROM chunks
ANTI JOIN (SELECT request_id FROM requests WHERE status <> 'finished') AS unfinished USING (request_id)
