-- MTP (speculative decoding) acceptance, as vLLM's spec_decode metrics define it:
-- acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts.
SELECT
    coalesce(sum(num_drafts), 0)                              AS drafts,
    coalesce(sum(num_draft_tokens), 0)                        AS draft_tokens,
    coalesce(sum(num_accepted_tokens), 0)                     AS accepted_tokens,
    sum(num_accepted_tokens) / nullif(sum(num_draft_tokens), 0)   AS acceptance_rate,
    1 + sum(num_accepted_tokens) / nullif(sum(num_drafts), 0)     AS mean_acceptance_length
FROM requests
