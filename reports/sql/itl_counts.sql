-- Inter-token latency samples (ms) as (value, how many samples have it): one gap per output chunk
-- after a request's first, pooled over all finished requests (a step that emits several tokens under
-- MTP is one chunk, so one gap). Long outputs contribute more gaps: this is vLLM's pooled ITL, not a
-- per-request mean. The same multiset as `time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER
-- BY time_ms)` over the `chunks` view, computed from the chunk runs (engine/output_schema.py) without
-- expanding them:
-- * inside a run, the gap after step s is end(s + 1) - end(s) of its replica, once for every run
--   covering both steps: a running sum of +1 at each run's first step and -1 at its last, over the
--   replica's steps, counts them (one pass over steps and runs, not over chunks);
-- * between two runs of one request (a preemption, a change of replica or of MTP token count), the
--   gap is the next run's first chunk time minus the previous run's last.
-- Chunk times are step ends, start_ms + duration_ms of steps.parquet, the doubles the engine emitted.
WITH ends AS (
    SELECT replica, step, start_ms + duration_ms AS end_ms,
           lead(start_ms + duration_ms) OVER (PARTITION BY replica ORDER BY step) AS next_end_ms
    FROM steps
),
runs AS (
    SELECT request, replica, first_step, first_step + num_steps - 1 AS last_step
    FROM chunk_runs
    SEMI JOIN (SELECT request FROM request_rows WHERE status = 'finished') AS finished USING (request)
),
within_runs AS (
    SELECT next_end_ms - end_ms AS itl_ms, n
    FROM (
        SELECT is_step, end_ms, next_end_ms,
               sum(delta) OVER (PARTITION BY replica ORDER BY step, is_step
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS n
        FROM (
            SELECT replica, step, true AS is_step, 0 AS delta, end_ms, next_end_ms FROM ends
            UNION ALL
            SELECT replica, first_step, false, 1, NULL, NULL FROM runs WHERE last_step > first_step
            UNION ALL
            SELECT replica, last_step, false, -1, NULL, NULL FROM runs WHERE last_step > first_step
        )
    )
    WHERE is_step AND n > 0
),
between_runs AS (
    SELECT first_ms - lag(last_ms) OVER (PARTITION BY request ORDER BY first_ms) AS itl_ms, 1 AS n
    FROM (
        SELECT r.request, f.end_ms AS first_ms, l.end_ms AS last_ms
        FROM runs r
        JOIN ends f ON f.replica = r.replica AND f.step = r.first_step
        JOIN ends l ON l.replica = r.replica AND l.step = r.last_step
    )
)
SELECT itl_ms, sum(n)::BIGINT AS n
FROM (SELECT itl_ms, n FROM within_runs
      UNION ALL
      SELECT itl_ms, n FROM between_runs WHERE itl_ms IS NOT NULL)
GROUP BY itl_ms
