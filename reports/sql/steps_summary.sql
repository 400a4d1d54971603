-- Engine-step summary: time-weighted means (each step weighs its duration) and peaks.
SELECT
    count(*)                                                        AS steps,
    fsum(duration_ms)                                               AS busy_ms,
    fsum(kv_usage * duration_ms) / nullif(fsum(duration_ms), 0)    AS kv_usage_mean,
    max(kv_usage)                                                   AS kv_usage_max,
    coalesce(fsum(duration_ms) FILTER (WHERE kv_usage >= 0.95), 0) / nullif(fsum(duration_ms), 0) AS kv_saturated_fraction,
    fsum(cpu_usage * duration_ms) / nullif(fsum(duration_ms), 0)   AS cpu_usage_mean,
    max(cpu_usage)                                                  AS cpu_usage_max,
    fsum(running * duration_ms) / nullif(fsum(duration_ms), 0)     AS running_mean,
    max(running)                                                    AS running_max,
    fsum(waiting * duration_ms) / nullif(fsum(duration_ms), 0)     AS waiting_mean,
    max(waiting)                                                    AS waiting_max,
    -- Still waiting when the run ended: each replica's last step, summed over the fleet (step
    -- numbers are per replica; one arg_max over all of them picked a replica by thread timing).
    (SELECT sum(w) FROM (SELECT arg_max(waiting, step) AS w FROM steps GROUP BY replica))::BIGINT AS waiting_final,
    coalesce(sum(bytes_stored), 0)                                  AS bytes_stored,
    coalesce(sum(bytes_loaded), 0)                                  AS bytes_loaded
FROM steps
