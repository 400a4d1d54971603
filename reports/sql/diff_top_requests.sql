-- The $limit requests whose E2E latency grew most (regressed) and shrank most (improved) in B.
(SELECT 'regressed' AS direction, request_id, session_id, turn, ttft_a, ttft_b, ttft_delta, e2e_a, e2e_b, e2e_delta
 FROM paired WHERE e2e_delta > 0 ORDER BY e2e_delta DESC, request_id LIMIT $limit)
UNION ALL
(SELECT 'improved' AS direction, request_id, session_id, turn, ttft_a, ttft_b, ttft_delta, e2e_a, e2e_b, e2e_delta
 FROM paired WHERE e2e_delta < 0 ORDER BY e2e_delta ASC, request_id LIMIT $limit)
