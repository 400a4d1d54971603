-- The requests the replay got most wrong, per metric: largest absolute error first (ties by id).
SELECT metric, request_id, grp, measured, predicted, error, ape
FROM (
    SELECT *, row_number() OVER (PARTITION BY metric ORDER BY abs_error DESC, request_id) AS rank
    FROM validate_pairs
)
WHERE rank <= $limit
ORDER BY CASE metric WHEN 'ttft' THEN 0 WHEN 'tpot' THEN 1 WHEN 'e2e' THEN 2 ELSE 3 END, rank
