-- Requests refused, by reason (admission control's bound, or why a request could never be replayed).
SELECT reject_reason AS reason, count(*) AS requests
FROM requests
WHERE status = 'rejected'
GROUP BY ALL
ORDER BY requests DESC, reason
