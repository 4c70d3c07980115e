"""Rollouts: what a trained role's model saw and produced, token by token, kept beside the
text events in compact Parquet shards (``rollouts/step-<n>-g<gen>.parquet``), one per
training step and writer generation, one row per turn of a trained role.

Columns (the ``rollouts`` view has them all, latest attempt of each session only):

    run_id, session_id, attempt, turn_index   the turn (same keys as the ``turns`` view)
    role, step                                the trained role; the training step (1-based)
    trajectory, group_key                     what the trainer grouped it into (see batch.py)
    policy_version                            optimizer updates the sampling weights had seen
    temperature                               the sampling temperature (log-probs use it)
    finish_reason                             stop | length
    prompt_ids, completion_ids  list<int32>   after the chat template / the sampled ids
    logprobs                    list<float32> per completion token, under the sampling weights
    gen                                       writer generation (0, +1 per resume)

A shard is written whole (temporary name, then rename), so a crash never leaves half a
shard; readers list the shards when the store is opened.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from askspec.runtime.store import layout

ROLLOUTS_DIR = "rollouts"

COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "session_id": "VARCHAR",
    "attempt": "INTEGER",
    "turn_index": "INTEGER",
    "role": "VARCHAR",
    "step": "BIGINT",
    "trajectory": "VARCHAR",
    "group_key": "VARCHAR",
    "policy_version": "BIGINT",
    "temperature": "DOUBLE",
    "finish_reason": "VARCHAR",
    "prompt_ids": "INTEGER[]",
    "completion_ids": "INTEGER[]",
    "logprobs": "FLOAT[]",
    "gen": "INTEGER",
}


def _schema():
    import pyarrow as pa

    types = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
             "INTEGER[]": pa.list_(pa.int32()), "FLOAT[]": pa.list_(pa.float32())}
    return pa.schema([(name, types[t]) for name, t in COLUMNS.items()])


def shard_path(run_dir: str | os.PathLike[str], step: int, gen: int) -> Path:
    return Path(run_dir) / ROLLOUTS_DIR / f"step-{step:06d}-g{gen}.parquet"


def write_shard(run_dir: str | os.PathLike[str], step: int, gen: int, rows: list[dict[str, Any]]) -> Path:
    """Write one step's rollout rows as a Parquet shard, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = shard_path(run_dir, step, gen)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = _schema()
    table = pa.Table.from_pylist([{k: row.get(k) for k in COLUMNS} for row in rows], schema=schema)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(3)}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def shards(run_dir: str | os.PathLike[str], refused: list[str] | None = None) -> list[Path]:
    """The run's rollout shards that a reader may open (``layout.refused_file``: no links,
    FIFOs or other special files); why each other one is not goes to ``refused``."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("step-*.parquet")):
        why = layout.refused_file(run_dir, f"{ROLLOUTS_DIR}/{p.name}")
        if why is None:
            out.append(p)
        elif refused is not None:
            refused.append(why)
    return out


def create_view(con, run_dirs: list[Path]) -> None:
    """The ``rollouts`` view over every shard of `run_dirs` (latest attempt per session)."""
    files = [p for rd in run_dirs for p in shards(rd)]
    cols = ", ".join(f'"{c}"' for c in COLUMNS)
    if files:
        listed = "[" + ", ".join("'" + os.fspath(p).replace("'", "''") + "'" for p in files) + "]"
        raw = f"SELECT {cols} FROM read_parquet({listed})"
    else:
        raw = "SELECT " + ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in COLUMNS.items()) + " WHERE false"
    con.execute(f"CREATE VIEW events_rollouts AS {raw}")
    con.execute(f"""CREATE VIEW rollouts AS
        SELECT o.* FROM events_rollouts o
        ANTI JOIN retried_sessions r
          ON r.run_id = o.run_id AND r.session_id = o.session_id AND r.attempt <> o.attempt""")
