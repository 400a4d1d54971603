-- The measured window, as `vllm bench serve` measures its duration: from the first request's
-- arrival to the last finished request's last token. last_event_ms also covers requests still in
-- flight, for the time axis of the over-time charts.
SELECT
    min(arrival_ms)                              AS start_ms,
    max(finish_ms)                               AS end_ms,
    (max(finish_ms) - min(arrival_ms)) / 1000.0  AS duration_s,
    greatest(max(arrival_ms), max(finish_ms), max(first_token_ms)) AS last_event_ms
FROM requests
