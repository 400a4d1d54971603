"""The base every other package stands on: errors, atomic writes, file checks, the sandboxed DuckDB
connection and the version. It imports nothing of the project, so any package may import it."""
