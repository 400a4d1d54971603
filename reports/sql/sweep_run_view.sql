-- One output file kind ({name}: requests or steps) across every run of a sweep, with a `config`
-- column (the run's config_hash in the `sweep` view). {paths} is the list of files, sweep_files maps
-- each file to its config; both are filled in by reports/sweep_views.py.
CREATE OR REPLACE VIEW {name} AS
SELECT f.config, t.* EXCLUDE (filename)
FROM read_parquet({paths}, filename = true, union_by_name = true) AS t
JOIN sweep_files AS f ON f.kind = '{name}' AND f.path = t.filename
