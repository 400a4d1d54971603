-- One-row summary of a canonical trace (registered as `trace`), for `replay inspect`.
-- Inter-arrival gaps are taken over rows sorted by arrival; CV = population stddev / mean.
WITH gaps AS (
    SELECT arrival_ms - lag(arrival_ms) OVER (ORDER BY arrival_ms) AS gap
    FROM trace
)
SELECT
    (SELECT count(*) FROM trace) AS rows,
    (SELECT (max(arrival_ms) - min(arrival_ms)) / 1000.0 FROM trace) AS span_s,
    (SELECT stddev_pop(gap) / nullif(avg(gap), 0) FROM gaps WHERE gap IS NOT NULL) AS interarrival_cv,
    (SELECT count(DISTINCT session_id) FROM trace) AS sessions,
    (SELECT avg(input_tokens) FROM trace) AS input_mean,
    (SELECT quantile_cont(input_tokens, [0.5, 0.9, 0.99]) FROM trace) AS input_q,
    (SELECT max(input_tokens) FROM trace) AS input_max,
    (SELECT avg(output_tokens) FROM trace) AS output_mean,
    (SELECT quantile_cont(output_tokens, [0.5, 0.9, 0.99]) FROM trace) AS output_q,
    (SELECT max(output_tokens) FROM trace) AS output_max,
    (SELECT sum(input_tokens) FROM trace) AS input_total
