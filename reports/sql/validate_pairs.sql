-- Per request and metric: the replay's prediction beside the log's measurement (long format).
-- Views: requests (the run), chunks, measured (request_id, grp, measured_* columns; NULL when the
-- log has none). Finished requests with both values only. Predicted cached tokens = GPU prefix hits
-- + G2 (host) hits at first admission: what vLLM reports as the request's cached prompt tokens.
-- ITL is each request's mean gap between streamed chunks: (last - first chunk) / (chunks - 1)
-- predicted, measured_itl_mean_ms measured (GuideLLM's ITL; the mean of the gaps for the others).
-- Queue, prefill and decode are vLLM's request-span phases: first scheduled - arrival, first token -
-- first scheduled, last token - first token.
-- error = predicted - measured; ape = |error| / measured (undefined when measured is 0).
CREATE OR REPLACE TEMP TABLE validate_pairs AS
WITH n_chunks AS (
    SELECT request_id, count(*) AS chunks FROM chunks
    WHERE request_id IN (SELECT request_id FROM measured WHERE measured_itl_mean_ms IS NOT NULL)
    GROUP BY request_id
), j AS (
    SELECT r.request_id, m.grp, r.ttft_ms, r.tpot_ms, r.e2e_ms, r.queue_ms,
           r.first_token_ms - r.first_scheduled_ms AS prefill_ms,
           r.finish_ms - r.first_token_ms AS decode_ms,
           CASE WHEN c.chunks > 1 THEN (r.finish_ms - r.first_token_ms) / (c.chunks - 1) END AS itl_ms,
           (r.cached_tokens + r.cpu_hit_tokens)::DOUBLE AS cached,
           m.measured_ttft_ms, m.measured_tpot_ms, m.measured_e2e_ms, m.measured_cached_tokens::DOUBLE AS m_cached,
           m.measured_itl_mean_ms, m.measured_queue_ms, m.measured_prefill_ms, m.measured_decode_ms
    FROM requests r JOIN measured m USING (request_id)
    LEFT JOIN n_chunks c USING (request_id)
    WHERE r.status = 'finished'
), long AS (
    SELECT request_id, grp, 'ttft' AS metric, ttft_ms AS predicted, measured_ttft_ms AS measured FROM j
    UNION ALL SELECT request_id, grp, 'tpot', tpot_ms, measured_tpot_ms FROM j
    UNION ALL SELECT request_id, grp, 'itl', itl_ms, measured_itl_mean_ms FROM j
    UNION ALL SELECT request_id, grp, 'e2e', e2e_ms, measured_e2e_ms FROM j
    UNION ALL SELECT request_id, grp, 'queue', queue_ms, measured_queue_ms FROM j
    UNION ALL SELECT request_id, grp, 'prefill', prefill_ms, measured_prefill_ms FROM j
    UNION ALL SELECT request_id, grp, 'decode', decode_ms, measured_decode_ms FROM j
    UNION ALL SELECT request_id, grp, 'cached_tokens', cached, m_cached FROM j
)
SELECT request_id, grp, metric, predicted, measured,
       predicted - measured AS error,
       abs(predicted - measured) AS abs_error,
       CASE WHEN measured > 0 THEN abs(predicted - measured) / measured END AS ape
FROM long
WHERE predicted IS NOT NULL AND measured IS NOT NULL
