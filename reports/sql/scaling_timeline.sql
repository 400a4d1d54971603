-- An autoscaled run's decisions, in time order (scaling.parquet through the `scaling` view).
SELECT time_ms, live, provisioning, draining, desired, arrivals, rejected, waiting, running, kv_usage, predicted_rate
FROM scaling
ORDER BY time_ms
