-- Requests finished in both runs, joined on request_id (the diff's paired sample). Ordered by
-- request_id so the seeded bootstrap sees the same order every time.
CREATE OR REPLACE TEMP TABLE paired AS
SELECT
    a.request_id,
    a.session_id,
    a.turn,
    a.ttft_ms              AS ttft_a,
    b.ttft_ms              AS ttft_b,
    a.e2e_ms               AS e2e_a,
    b.e2e_ms               AS e2e_b,
    b.ttft_ms - a.ttft_ms  AS ttft_delta,
    b.e2e_ms - a.e2e_ms    AS e2e_delta
FROM a_requests AS a JOIN b_requests AS b USING (request_id)
WHERE a.status = 'finished' AND b.status = 'finished'
ORDER BY a.request_id
