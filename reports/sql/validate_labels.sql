-- The run's headline metrics per value of one trace label (view labels: request_id, grp).
-- Latencies over finished requests (quantile_cont = numpy.percentile, linear); prefix hit ratio =
-- (GPU + host hits) / prompt tokens of admitted requests, as in the report's reuse section.
SELECT l.grp,
       count(*)                                                             AS requests,
       count(*) FILTER (WHERE r.status = 'finished')                        AS finished,
       quantile_cont(r.ttft_ms, [0.5, 0.9, 0.99]) FILTER (WHERE r.status = 'finished') AS ttft_q,
       quantile_cont(r.tpot_ms, [0.5, 0.9, 0.99]) FILTER (WHERE r.status = 'finished') AS tpot_q,
       quantile_cont(r.e2e_ms, [0.5, 0.9, 0.99]) FILTER (WHERE r.status = 'finished')  AS e2e_q,
       sum(r.cached_tokens + r.cpu_hit_tokens) FILTER (WHERE r.status <> 'rejected')::DOUBLE
         / nullif(sum(r.input_tokens) FILTER (WHERE r.status <> 'rejected'), 0) AS hit_ratio
FROM requests r JOIN labels l USING (request_id)
GROUP BY l.grp
ORDER BY requests DESC, l.grp
