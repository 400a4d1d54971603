-- Per request, in trace order, what a benchmark tool records: lengths, times and the gaps between
-- consecutive output chunks (one gap per engine step that emitted tokens, as a streaming client
-- sees them). Unfinished and rejected requests keep their status and reason.
WITH gaps AS (
    SELECT request_id, time_ms, time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER BY time_ms) AS gap
    FROM chunks
), itl AS (
    SELECT request_id, list(gap ORDER BY time_ms) FILTER (WHERE gap IS NOT NULL) AS itl_ms
    FROM gaps
    GROUP BY request_id
)
SELECT r.request_id, r.session_id, r.turn, r.arrival_ms, r.input_tokens, r.output_tokens, r.ttft_ms, r.tpot_ms,
       r.e2e_ms, r.finish_ms, r.status, r.reject_reason, coalesce(i.itl_ms, []) AS itl_ms
FROM requests r
LEFT JOIN itl i USING (request_id)
ORDER BY r.arrival_ms, r.request_id
