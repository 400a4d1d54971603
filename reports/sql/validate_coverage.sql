-- How many requests could be compared: replayed, finished, with a measurement row, and the
-- measurement rows that match no replayed request (other ids, or rows beyond load.max_requests).
SELECT
    (SELECT count(*) FROM requests)                                            AS replayed,
    (SELECT count(*) FROM requests WHERE status = 'finished')                  AS finished,
    (SELECT count(*) FROM measured)                                            AS measured_rows,
    (SELECT count(*) FROM requests r JOIN measured m USING (request_id)
      WHERE r.status = 'finished')                                             AS matched,
    (SELECT count(*) FROM measured m ANTI JOIN requests r USING (request_id))  AS unmatched_measured
