-- Every compared pair, for the charts (stable order: metric, then request id).
SELECT metric, predicted, measured, ape
FROM validate_pairs
ORDER BY metric, request_id
