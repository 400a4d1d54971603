-- Sessions ranked by the total E2E latency their paired requests gained (regressed) or lost
-- (improved) in B: the user-visible cost of a whole conversation.
WITH s AS (
    SELECT session_id,
           count(*)            AS requests,
           fsum(e2e_delta)     AS e2e_delta_total,
           fsum(e2e_delta) / count(*) AS e2e_delta_mean,
           fsum(ttft_delta) / count(*) AS ttft_delta_mean
    FROM paired
    WHERE session_id IS NOT NULL
    GROUP BY session_id
)
(SELECT 'regressed' AS direction, * FROM s WHERE e2e_delta_total > 0
 ORDER BY e2e_delta_total DESC, session_id LIMIT $limit)
UNION ALL
(SELECT 'improved' AS direction, * FROM s WHERE e2e_delta_total < 0
 ORDER BY e2e_delta_total ASC, session_id LIMIT $limit)
