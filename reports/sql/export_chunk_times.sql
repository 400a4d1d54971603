-- Every output chunk's time with its request's position in export_requests.sql's order, sorted by
-- (position, time): a streaming client's view of each request in turn. The sort spills to disk.
WITH ordered AS (
    SELECT request_id, row_number() OVER (ORDER BY arrival_ms, request_id) - 1 AS pos
    FROM requests
)
SELECT o.pos, c.time_ms
FROM chunks c
JOIN ordered o USING (request_id)
ORDER BY o.pos, c.time_ms
