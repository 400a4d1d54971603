-- Per replica and bucket of $bucket_ms: the fraction of the bucket the replica was busy stepping.
-- A step is split over the buckets it overlaps, so no bucket passes 1; the few steps that cross a
-- bucket boundary take the slower path (one row per bucket they touch).
WITH spans AS (
    SELECT
        replica,
        start_ms                                            AS a,
        start_ms + duration_ms                              AS e,
        floor(start_ms / $bucket_ms)::BIGINT                AS b0,
        floor((start_ms + duration_ms) / $bucket_ms)::BIGINT AS b1
    FROM fleet_steps
),
pieces AS (
    SELECT replica, b0 AS bucket, e - a AS busy_ms FROM spans WHERE b1 <= b0
    UNION ALL
    SELECT replica, bucket, least(e, (bucket + 1) * $bucket_ms) - greatest(a, bucket * $bucket_ms) AS busy_ms
    FROM (SELECT replica, a, e, unnest(range(b0, b1 + 1)) AS bucket FROM spans WHERE b1 > b0)
)
SELECT replica, bucket, fsum(busy_ms) / $bucket_ms AS busy_fraction
FROM pieces
WHERE busy_ms > 0
GROUP BY ALL
ORDER BY replica, bucket
