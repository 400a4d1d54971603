-- Prefix reuse as vLLM counts it (in tokens, at first admission): GPU prefix-cache hits and G2
-- (CPU offload) hits over the prompt tokens of admitted requests.
SELECT
    coalesce(sum(input_tokens), 0)                 AS prompt_tokens,
    coalesce(sum(cached_tokens), 0)                AS gpu_hit_tokens,
    coalesce(sum(cpu_hit_tokens), 0)               AS cpu_hit_tokens,
    sum(cached_tokens) / nullif(sum(input_tokens), 0)                     AS gpu_hit_ratio,
    sum(cpu_hit_tokens) / nullif(sum(input_tokens), 0)                    AS cpu_hit_ratio,
    (sum(cached_tokens) + sum(cpu_hit_tokens)) / nullif(sum(input_tokens), 0) AS total_hit_ratio
FROM requests
WHERE status <> 'rejected'
