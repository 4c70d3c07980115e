"""``askspec metrics RUN``: the spec's declared metrics over a run, as a table, CSV or JSON."""

from __future__ import annotations

import json

from askspec.runtime.engine.metrics import run_metrics


def register(sub) -> None:
    p = sub.add_parser("metrics", help="evaluate the spec's declared metrics over a run")
    p.add_argument("run_dir")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_metrics)


def _shown(row: dict) -> str | None:
    value = row["value"]
    if row["n"] == 0:
        return "no sessions"  # its `where` kept none: no value, not a NULL beside a count
    if value is None:
        return None
    return str(round(value, 4) if isinstance(value, float) else value)


def cmd_metrics(args) -> int:
    import sys

    from askspec.terminal import os_error, printable

    try:
        rows, errors = run_metrics(args.run_dir)
    except OSError as e:  # one sentence naming the path, not "[Errno 2] ..."
        print(f"error: {os_error(e, 'cannot read') if e.filename else printable(str(e))}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {printable(str(e), single_line=True)}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
    else:
        import pyarrow as pa

        columns: dict[str, list] = {"run_id": [r["run_id"] for r in rows]}
        if any("stage" in r for r in rows):  # a spec with stages: every row belongs to one
            columns["stage"] = [r.get("stage") for r in rows]
        table = pa.table({
            **columns,
            "metric": [r["metric"] for r in rows],
            "by": [", ".join(f"{k}={v}" for k, v in r["by"].items()) for r in rows],
            "value": [_shown(r) for r in rows],
            "n": [r["n"] for r in rows],
        })
        if args.format == "csv":
            from askspec.runtime.commands.query import _write_csv

            _write_csv(table, sys.stdout)
        else:
            from askspec.runtime.commands.query import format_table

            print(format_table(table))
    if errors:
        print(f"note: {errors} session(s) ended in error and are excluded", file=sys.stderr)
    return 0
