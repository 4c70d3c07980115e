"""Run store: run directories, append-only event files, DuckDB views.

- ``layout``   file names, event schemas, run ids, manifest helpers
- ``writer``   ``RunWriter``: what a running experiment calls (never opens DuckDB)
- ``views``    ``open_store`` / ``connect``: in-memory DuckDB views over runs
- ``compact``  ``compact_run``: Parquet copies of a finished run's events

Nothing is imported here, so the engine importing the writer does not load DuckDB.
"""
