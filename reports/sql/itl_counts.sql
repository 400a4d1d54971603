-- Inter-token latency samples (ms) as (value, how many samples have it): one gap per output chunk
-- after a request's first, pooled over all finished requests (a step that emits several tokens under
-- MTP is one chunk, so one gap). Long outputs contribute more gaps: this is vLLM's pooled ITL, not a
-- per-request mean. The same multiset as `time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER
-- BY time_ms)` over the `chunks` view, computed from the chunk runs (engine/output_schema.py) without
-- expanding them:
-- * inside a run, the gap after step s is end(s + 1) - end(s) of its replica, once for every run
--   covering both steps: the count is a running sum of +1 at each run's first step and -1 at its
--   last, taken over the change points only (two per run) and attached to every step by an ASOF
--   join; the next step's end comes from a hash join on step + 1 (no window over the steps, whose
--   sort is the costly part at tens of millions of steps);
-- * between two runs of one request (a preemption, a change of replica or of MTP token count), the
--   gap is the next run's first chunk time minus the previous run's last.
-- Chunk times are step ends, start_ms + duration_ms of steps.parquet, the doubles the engine emitted.
WITH ends AS (
    SELECT replica, step, end_ms FROM step_ends
),
runs AS (
    SELECT request, replica, first_step, first_step + num_steps - 1 AS last_step
    FROM chunk_runs
    SEMI JOIN (SELECT request FROM request_rows WHERE status = 'finished') AS finished USING (request)
),
coverage AS (
    SELECT replica, step,
           sum(delta) OVER (PARTITION BY replica ORDER BY step
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS n
    FROM (
        SELECT replica, step, sum(delta) AS delta
        FROM (SELECT replica, first_step AS step, 1 AS delta FROM runs WHERE last_step > first_step
              UNION ALL
              SELECT replica, last_step, -1 FROM runs WHERE last_step > first_step)
        GROUP BY ALL
    )
),
covered AS (
    SELECT e.replica, e.step, e.end_ms, c.n
    FROM ends e ASOF JOIN coverage c ON e.replica = c.replica AND e.step >= c.step
    WHERE c.n > 0
),
within_runs AS (
    SELECT nxt.end_ms - s.end_ms AS itl_ms, s.n
    FROM covered s JOIN ends nxt ON nxt.replica = s.replica AND nxt.step = s.step + 1
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
