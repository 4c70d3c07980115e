"""Run store: run directories, append-only event files, DuckDB views."""
