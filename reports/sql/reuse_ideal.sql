-- Token-level prefix hit ratio with an infinite cache, over the whole trace (trace_ideal.sql).
SELECT
    coalesce(sum(ideal_hit_tokens), 0)                         AS ideal_hit_tokens,
    coalesce(sum(input_tokens), 0)                             AS trace_prompt_tokens,
    sum(ideal_hit_tokens) / nullif(sum(input_tokens), 0)       AS ideal_hit_ratio
FROM trace_ideal
