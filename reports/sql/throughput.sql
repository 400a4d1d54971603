-- Request counts by status, token totals of finished requests, and throughput over run_window.
SELECT
    count(*)                                               AS requests,
    count(*) FILTER (WHERE status = 'finished')            AS completed,
    count(*) FILTER (WHERE status = 'rejected')            AS rejected,
    count(*) FILTER (WHERE status = 'unfinished')          AS unfinished,
    coalesce(sum(input_tokens) FILTER (WHERE status = 'finished'), 0)   AS input_tokens,
    coalesce(sum(output_tokens) FILTER (WHERE status = 'finished'), 0)  AS output_tokens,
    any_value(w.duration_s)                                AS duration_s,
    count(*) FILTER (WHERE status = 'finished') / any_value(w.duration_s)               AS request_throughput,
    coalesce(sum(output_tokens) FILTER (WHERE status = 'finished'), 0) / any_value(w.duration_s) AS output_throughput,
    coalesce(sum(input_tokens + output_tokens) FILTER (WHERE status = 'finished'), 0)
        / any_value(w.duration_s)                          AS total_token_throughput
FROM requests, run_window AS w
