-- Preemptions (recompute) over every request that was admitted, whatever its final status.
SELECT
    coalesce(sum(num_preemptions), 0)                     AS preemptions,
    count(*) FILTER (WHERE num_preemptions > 0)           AS preempted_requests
FROM requests
WHERE status <> 'rejected'
