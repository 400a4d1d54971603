"""Sweeps and SLO capacity planning: many configs of one trace, each an ordinary `replay run`.

Modules, one job each: ``grid`` (the --grid/--vary syntax and the cartesian product), ``store``
(config hashing and the content-addressed result store), ``summary`` (one row of metrics per run, from
replay.reports.metrics), ``job`` (one config run inside a worker), ``executors`` (local process pool or Ray),
``runner`` (a sweep end to end), ``plan`` (bisection over a monotone key) and ``table``
(sweep.parquet).
"""
