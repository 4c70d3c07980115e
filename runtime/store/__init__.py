"""Run store: run directories, append-only event files, DuckDB views.

- ``layout``   file names, event schemas, run ids, manifest helpers
- ``writer``   ``RunWriter``: what a running experiment calls (never opens DuckDB)
- ``views``    ``open_store`` / ``connect``: in-memory DuckDB views over runs
- ``compact``  ``compact_run``: Parquet copies of a finished run's events; ``restore_ndjson`` back
- ``overflow`` strings too long for one line, moved to side files
- ``check``    damaged event lines: finding them, quarantining them
- ``recover``  what a resume does before appending (copies, damaged lines)

Nothing is imported here, so the engine importing the writer does not load DuckDB
(only a resume that must rebuild from Parquet does). See docs/store.md.
"""
