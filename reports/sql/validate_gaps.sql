-- Every gap between streamed chunks, pooled (vLLM's and vllm bench's ITL: long outputs weigh more),
-- measured and predicted over the same requests: finished in the replay with recorded gaps.
-- Views: measured_gaps (request_id, grp, gap_ms: one row per recorded gap), requests, chunks.
-- Predicted gaps are the differences of each request's sorted chunk times (as itl_gaps.sql).
CREATE OR REPLACE TEMP TABLE validate_gaps AS
WITH matched AS (
    SELECT DISTINCT g.request_id, g.grp
    FROM measured_gaps g JOIN requests r USING (request_id)
    WHERE r.status = 'finished'
), predicted AS (
    SELECT request_id, unnest(list_slice(times, 2, len(times))) - unnest(list_slice(times, 1, len(times) - 1)) AS gap_ms
    FROM (SELECT request_id, list_sort(list(time_ms)) AS times FROM chunks
          WHERE request_id IN (SELECT request_id FROM matched)
          GROUP BY request_id)
)
SELECT 'measured' AS side, m.grp, g.gap_ms FROM measured_gaps g JOIN matched m USING (request_id, grp)
UNION ALL
SELECT 'predicted', m.grp, p.gap_ms FROM predicted p JOIN matched m USING (request_id)
