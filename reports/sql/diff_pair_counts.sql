-- How the two runs' requests pair up: finished in both, in one only, or present in one run only.
SELECT
    count(*) FILTER (WHERE a.status = 'finished' AND b.status = 'finished')             AS finished_both,
    count(*) FILTER (WHERE a.status = 'finished' AND coalesce(b.status, '') <> 'finished') AS finished_a_only,
    count(*) FILTER (WHERE b.status = 'finished' AND coalesce(a.status, '') <> 'finished') AS finished_b_only,
    count(*) FILTER (WHERE a.request_id IS NULL OR b.request_id IS NULL)                  AS unmatched
FROM a_requests AS a FULL OUTER JOIN b_requests AS b USING (request_id)
