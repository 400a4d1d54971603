-- Per replica and bucket of $bucket_ms (by step start): the fraction of the bucket the replica was
-- busy stepping. A step is counted whole in the bucket it starts in (steps are far shorter than a bucket).
SELECT
    replica,
    floor(start_ms / $bucket_ms)::BIGINT        AS bucket,
    fsum(duration_ms) / $bucket_ms              AS busy_fraction
FROM fleet_steps
GROUP BY ALL
ORDER BY replica, bucket
