-- The ITL samples of one more part of the requests (see itl_gaps.sql and itl_samples.sql).
INSERT INTO itl_samples
SELECT itl_ms FROM itl_gaps_part({parts}, {part}) WHERE itl_ms IS NOT NULL
