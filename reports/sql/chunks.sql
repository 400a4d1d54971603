-- The `chunks` view: every output chunk (request_id, time_ms, tokens), expanded from the runs of
-- chunks.parquet (engine/output_schema.py): each run's steps, each step's end from steps.parquet.
SELECT q.request_id, e.end_ms AS time_ms, c.tokens
FROM (SELECT request, replica, tokens, unnest(range(first_step, first_step + num_steps)) AS step
      FROM chunk_runs) AS c
JOIN step_ends AS e USING (replica, step)
JOIN request_rows AS q USING (request)
