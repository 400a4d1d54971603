-- itl_counts.sql for an output written before chunk runs, whose chunks.parquet holds one row per
-- chunk (request_id, time_ms, tokens): each request's chunk times gathered into one sorted list, the
-- gaps are the element-wise differences of the list without its first and without its last element.
SELECT later - earlier AS itl_ms, count(*) AS n
FROM (
    SELECT unnest(list_slice(times, 2, len(times)))     AS later,
           unnest(list_slice(times, 1, len(times) - 1)) AS earlier
    FROM (SELECT request_id, list_sort(list(time_ms)) AS times FROM chunks GROUP BY request_id) AS per_request
    ANTI JOIN (SELECT request_id FROM requests WHERE status <> 'finished') AS unfinished USING (request_id)
)
GROUP BY ALL
