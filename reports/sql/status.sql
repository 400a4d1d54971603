-- Requests that could not be measured: rejected (with reason) and unfinished.
SELECT status, coalesce(reject_reason, '') AS reason, count(*) AS requests
FROM requests
WHERE status <> 'finished'
GROUP BY ALL
ORDER BY requests DESC, status, reason
