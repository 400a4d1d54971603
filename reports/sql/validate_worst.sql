-- The requests the replay got most wrong, per metric: largest absolute error first (ties by id).
SELECT metric, request_id, grp, measured, predicted, error, ape
FROM (
    SELECT *, row_number() OVER (PARTITION BY metric ORDER BY abs_error DESC, request_id) AS rank
    FROM validate_pairs
)
WHERE rank <= $limit
ORDER BY CASE metric WHEN 'ttft' THEN 0 WHEN 'tpot' THEN 1 WHEN 'itl' THEN 2 WHEN 'e2e' THEN 3
                     WHEN 'queue' THEN 4 WHEN 'prefill' THEN 5 WHEN 'decode' THEN 6 ELSE 7 END, rank
