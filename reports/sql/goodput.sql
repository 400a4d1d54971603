-- Goodput: finished requests meeting every given SLO (ms; a NULL parameter means "no SLO").
-- As in `vllm bench serve --goodput`: a metric meets its SLO when value <= SLO, and a request with
-- one output token has TPOT 0 there (it has no TPOT), so it always meets a TPOT SLO.
SELECT
    count(*) FILTER (WHERE ($ttft IS NULL OR ttft_ms <= $ttft)
                       AND ($tpot IS NULL OR coalesce(tpot_ms, 0) <= $tpot)
                       AND ($e2e IS NULL OR e2e_ms <= $e2e))       AS good_requests,
    count(*)                                                       AS completed,
    good_requests / nullif(count(*), 0)                            AS good_fraction,
    good_requests / any_value(w.duration_s)                        AS goodput
FROM requests, run_window AS w
WHERE status = 'finished'
