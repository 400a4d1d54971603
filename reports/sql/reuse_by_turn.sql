-- Reuse by session turn: measured GPU and CPU hits of admitted requests beside the infinite-cache
-- ideal of the trace rows of the same turn. Turns >= $turn_cap are pooled into one row
-- (turn_key = $turn_cap); requests outside any session have turn_key -1.
WITH measured AS (
    SELECT CASE WHEN turn IS NULL THEN -1 ELSE least(turn, $turn_cap) END  AS turn_key,
           count(*)                              AS requests,
           sum(input_tokens)                     AS prompt_tokens,
           sum(cached_tokens)                    AS gpu_hit_tokens,
           sum(cpu_hit_tokens)                   AS cpu_hit_tokens
    FROM requests
    WHERE status <> 'rejected'
    GROUP BY ALL
),
ideal AS (
    SELECT CASE WHEN turn IS NULL THEN -1 ELSE least(turn, $turn_cap) END  AS turn_key,
           sum(input_tokens)                     AS trace_prompt_tokens,
           sum(ideal_hit_tokens)                 AS ideal_hit_tokens
    FROM trace_ideal
    GROUP BY ALL
)
SELECT
    turn_key,
    coalesce(m.requests, 0)                                        AS requests,
    m.gpu_hit_tokens / nullif(m.prompt_tokens, 0)                  AS gpu_hit_ratio,
    m.cpu_hit_tokens / nullif(m.prompt_tokens, 0)                  AS cpu_hit_ratio,
    i.ideal_hit_tokens / nullif(i.trace_prompt_tokens, 0)          AS ideal_hit_ratio
FROM measured AS m FULL OUTER JOIN ideal AS i USING (turn_key)
ORDER BY turn_key
