-- Per request, in trace order, what a benchmark tool records: lengths and times. Unfinished and
-- rejected requests keep their status and reason. The gaps between output chunks come from
-- export_chunk_times.sql, streamed beside it (reports/export.py): a list per request built here
-- could not spill to disk.
SELECT r.request_id, r.session_id, r.turn, r.arrival_ms, r.input_tokens, r.output_tokens, r.ttft_ms, r.tpot_ms,
       r.e2e_ms, r.finish_ms, r.status, r.reject_reason, r.cached_tokens + r.cpu_hit_tokens AS cached_tokens
FROM requests r
ORDER BY r.arrival_ms, r.request_id
