"""On-disk layout of a run directory and the schema of its event files.

A run directory ``<out>/<run-id>/`` holds::

    manifest.json          run metadata; replaced atomically (tmp + os.replace)
    ir.json, ir.hash       the compiled game graph and its content hash
    spec/                  the spec text and prompt files exactly as run
    events/<name>.ndjson   append-only event logs, one JSON object per line
    events/<name>.parquet  optional compacted copies (see compact.py)
    events/compaction.json which NDJSON sizes the Parquet files were built from

This module is the single source of truth for file names and column types: the
writer produces these fields, the views and the compactor read them with exactly
these DuckDB types (explicit types keep empty files and schema drift harmless).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import re
import secrets
import stat
import time
from importlib import metadata
from pathlib import Path
from typing import Any

# 2: turns store prompt deltas (prompt_chain, prompt_link); every event may carry
# ``overflow`` (strings moved to side files, see writer.py); sessions.bookkeeping,
# turns.group_id, groups.judge_calls/unparsed. Version 1 lines read as version 2
# lines without those fields (full prompts, nothing moved).
# 3: train_steps.skipped (why a step's update did not run); older lines read it as NULL.
# 4: sessions.step, stage, weights (a training run's step, stage and evaluate-stage weights,
# before kept in params as __step__, __stage__, __weights__: the sessions view reads either).
# 5: train_steps.mismatch_abs, mismatch_kl (sampler vs trainer on on-policy tokens); older
# lines read them as NULL.
# 6: sessions.seed (the session's sampling seed, on its started line); older lines read it
# as NULL.
FORMAT_VERSION = 6

MANIFEST = "manifest.json"
IR_JSON = "ir.json"
IR_HASH = "ir.hash"
SPEC_DIR = "spec"
EVENTS_DIR = "events"
COMPACTION_INDEX = "compaction.json"
QUARANTINE = "quarantine.ndjson"  # damaged lines moved out of the event files by a resume
OVERFLOW_DIR = "overflow"  # events/overflow/<sha256>.txt: strings too long to store inline

# Columns every event line carries. ``seq`` is per file and strictly increasing in
# file order; ``gen`` is the writer generation (0 when created, +1 per resume).
COMMON_COLUMNS: dict[str, str] = {
    "seq": "BIGINT",
    "ts": "TIMESTAMP",  # ISO-8601 UTC ("...Z"); TIMESTAMP (not TIMESTAMPTZ) needs no pytz
    "run_id": "VARCHAR",
    "gen": "INTEGER",
}

# Event file name -> its own columns (after the common ones). Order matters only
# for ``SELECT *`` readability.
EVENT_SCHEMAS: dict[str, dict[str, str]] = {
    "sessions": {
        "event": "VARCHAR",  # started | finished
        "session_id": "VARCHAR",
        "attempt": "INTEGER",
        "index": "BIGINT",
        "game": "VARCHAR",
        "group_id": "VARCHAR",
        "params": "JSON",
        "status": "VARCHAR",  # ok | error (finished only)
        "outcome": "VARCHAR",
        "error": "VARCHAR",
        "vars": "JSON",
        # the engine's own record (stateful calls, buffer pushes, dropped turns), kept out of vars
        "bookkeeping": "JSON",
        # started only, set by the trainer (engine.plan.SessionPlan), NULL in an evaluation run
        "step": "BIGINT",
        "stage": "VARCHAR",
        "weights": "VARCHAR",  # an evaluate stage's trained | initial
        # started only: the session's sampling seed (engine.plan.SessionPlan.seed; every
        # model call's seed derives from it, engine.calls.call_seed), so it replays alone
        "seed": "BIGINT",
    },
    "turns": {
        "session_id": "VARCHAR",
        "attempt": "INTEGER",
        "turn_index": "INTEGER",
        "role": "VARCHAR",
        "model": "VARCHAR",
        # The messages sent, as a delta: ``prompt`` holds what this prompt adds to
        # the same role's previous prompt in this session attempt. The chain of
        # deltas starts at turn ``prompt_chain`` (whose prompt is stored whole)
        # and this is its ``prompt_link``-th delta (1, 2, ...). Both are absent on
        # a turn whose prompt is stored whole. The turns view rebuilds the full
        # prompt: the concatenation of the chain's message arrays up to this turn.
        "prompt": "JSON",
        "prompt_chain": "INTEGER",
        "prompt_link": "INTEGER",
        "text": "VARCHAR",
        "parsed": "JSON",
        "finish_reason": "VARCHAR",
        "tokens_in": "INTEGER",
        "tokens_out": "INTEGER",
        "latency_ms": "DOUBLE",
        "error": "VARCHAR",
        "group_id": "VARCHAR",  # a group route's judge call (its session_id is the group id)
        "ttft_ms": "DOUBLE",  # time to the first token, where the backend reports it (hf)
    },
    "rewards": {
        "session_id": "VARCHAR",
        "attempt": "INTEGER",
        "role": "VARCHAR",
        "turn_index": "INTEGER",
        "name": "VARCHAR",
        "value": "DOUBLE",
        "kind": "VARCHAR",  # turn | terminal
    },
    "groups": {
        "group_id": "VARCHAR",
        "route": "VARCHAR",
        "stats": "JSON",
        "members": "VARCHAR[]",
        "judge_calls": "INTEGER",  # judge calls the route made for this group
        "unparsed": "INTEGER",  # of those, the ones that gave no parseable verdict
    },
    "matches": {
        "group_id": "VARCHAR",
        "a": "VARCHAR",
        "b": "VARCHAR",
        "first_shown": "VARCHAR",
        "verdict": "VARCHAR",
        "outcome": "DOUBLE",
        "raw": "VARCHAR",
    },
    # one optimizer step of a trained role; the flat columns are TRAIN_STEP_COLUMNS, and
    # `metrics` holds them again with anything else the trainer measured
    "train_steps": {
        "role": "VARCHAR",
        "step": "BIGINT",
        "loss": "DOUBLE",
        "reward_mean": "DOUBLE",  # mean trajectory reward of the batch
        "reward_std": "DOUBLE",
        "zero_adv_share": "DOUBLE",  # share of trajectories with advantage 0
        "kl": "DOUBLE",  # mean per-token KL to the frozen initial weights (k1/k3 as configured)
        "clip_frac": "DOUBLE",  # share of tokens whose ratio was clipped
        # sampler vs trainer over the on-policy rows' trained tokens, before the update: mean
        # |log π_train − log π_sampler| and the KL between them (k3); float noise on-policy
        "mismatch_abs": "DOUBLE",
        "mismatch_kl": "DOUBLE",
        "grad_norm": "DOUBLE",  # before clipping
        "lr": "DOUBLE",
        "tokens": "BIGINT",  # trained (completion) tokens
        "seconds": "DOUBLE",  # wall time of the step: play + update
        # NULL when the update ran, else why not: zero_advantage | no_tokens | nonfinite | gate |
        # empty_buffer | no_data (TRAIN_SKIP_REASONS; metrics.skip_reason says it in words)
        "skipped": "VARCHAR",
        "metrics": "JSON",
    },
    # a buffer's life (runtime/scoring/buffers.py): an item pushed, refused by a full
    # buffer, replayed (with the replaying game's score) or evicted (with the reason);
    # `step`/`phase` say when, in a training schedule
    "buffer_events": {
        "buffer": "VARCHAR",
        "event": "VARCHAR",  # push | rejected | replay | evict
        "item": "BIGINT",  # the item's number in its buffer (push order)
        "value": "JSON",  # the item (push, rejected, evict)
        "reason": "VARCHAR",  # evict: capacity | solved | no_peak; rejected: full
        "score": "DOUBLE",  # replay / score-based evict: the replay's score
        "best": "DOUBLE",  # the item's best score so far
        "replays": "INTEGER",  # the item's replays so far
        "step": "BIGINT",  # the training step (global, schedule order), null when evaluating
        "phase": "VARCHAR",
    },
    # the nested schedule's inner loop (runtime/train/nested.py), per outer `step`:
    # baseline (the untrained inner role's accuracy), inner_step (a copy's update: metrics in
    # `data`), copy (a trained copy's accuracy), dataset (the outer reward R_k = mean copy
    # accuracy - baseline; `data` holds the dataset), decision (the moving average, the
    # threshold, whether it promoted), promotion (the promoted copy and its dataset)
    "nested_events": {
        "step": "BIGINT",
        "event": "VARCHAR",  # baseline | inner_step | copy | dataset | decision | promotion
        "dataset": "INTEGER",  # k, 1-based
        "copy": "INTEGER",  # j, 1-based
        "inner_step": "INTEGER",  # 1-based
        "value": "DOUBLE",  # accuracy, reward, loss or moving average (see event)
        "data": "JSON",
    },
}
TRAIN_STEP_COLUMNS = ("loss", "reward_mean", "reward_std", "zero_adv_share", "kl", "clip_frac", "grad_norm", "lr",
                      "tokens", "seconds", "skipped", "mismatch_abs", "mismatch_kl")
# train_steps.skipped: why a step's update did not run (docs/training.md, "Skipped steps")
TRAIN_SKIP_REASONS = ("zero_advantage", "no_tokens", "nonfinite", "gate", "empty_buffer", "no_data")

EVENT_NAMES: tuple[str, ...] = tuple(EVENT_SCHEMAS)
# Event files added after runs already existed: an older run lacks them, which is no damage
# (its views are empty; a resume creates the file).
LATER_EVENTS = frozenset({"buffer_events", "nested_events"})

# Every event may end with ``overflow``: a list of {path, chars, file, sha256} for
# strings the writer moved to ``events/overflow/`` (their first characters stay inline).
OVERFLOW_COLUMN: dict[str, str] = {"overflow": "JSON"}

# Columns added after format 1 (absent from Parquet copies compacted by format 1; a copy
# of format 2 to 5 lacks the later ones, found by reading its schema).
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    name: {"turns": ("prompt_chain", "prompt_link", "group_id", "ttft_ms"),
           "sessions": ("bookkeeping", "step", "stage", "weights", "seed"),
           "groups": ("judge_calls", "unparsed"), "train_steps": ("skipped", "mismatch_abs", "mismatch_kl")}.get(name, ()) + ("overflow",)
    for name in EVENT_SCHEMAS
}

# Columns without which a line means nothing: a line lacking one (or holding a
# value of the wrong type, see check.py) is damaged. The views drop such rows.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "sessions": ("event", "session_id", "attempt"),
    "turns": ("session_id", "attempt", "turn_index", "role"),
    "rewards": ("session_id", "attempt", "role", "name", "kind"),
    "groups": ("group_id",),
    "matches": ("group_id",),
    "train_steps": ("role", "step"),
    "buffer_events": ("buffer", "event", "item"),
    "nested_events": ("step", "event"),
}
COMMON_REQUIRED = ("seq", "ts", "run_id", "gen")

# Manifest fields the ``runs`` view exposes, with their types.
MANIFEST_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "experiment": "VARCHAR",
    "experiment_hash": "VARCHAR",
    "status": "VARCHAR",
    "started_at": "TIMESTAMP",
    "ended_at": "TIMESTAMP",
    "seed": "BIGINT",
    "planned_sessions": "BIGINT",
    "resumes": "INTEGER",
    "roles": "JSON",  # per role: the declared model and the models it ran on (backend, endpoint)
    "params": "JSON",
    "versions": "JSON",
    "overrides": "JSON",  # --set values
    "run_options": "JSON",  # backend, base_url, served models, concurrency, max_tokens, sessions, profile
    "totals": "JSON",  # turns and tokens over every process of the run (set when one ends)
    "duration_s": "DOUBLE",  # seconds the run's processes ran (set when one ends)
    # one entry per process (gen, pid, host, started_at, heartbeat_at, ended_at, status, totals)
    "history": "JSON",
}

RUN_STATUSES = ("running", "finished", "failed", "interrupted")  # as recorded; shown: liveness.py

# Distributions recorded in the manifest; a missing one is recorded as null.
TRACKED_PACKAGES = (
    "askspec",
    "duckdb",
    "pyarrow",
    "pydantic",
    "lark",
    "jinja2",
    "numpy",
    "torch",
    "transformers",
    "vllm",
    "openai",
    "openrlhf",
    "sentence-transformers",
    "math-verify",
    "textual",
)


def columns(name: str) -> dict[str, str]:
    """All columns (common + specific + overflow) of event file ``name``, in file order."""
    return {**COMMON_COLUMNS, **EVENT_SCHEMAS[name], **OVERFLOW_COLUMN}


def required(name: str) -> tuple[str, ...]:
    """Columns every line of event file ``name`` must carry (non-null)."""
    return COMMON_REQUIRED + REQUIRED_COLUMNS[name]


def events_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / EVENTS_DIR


def ndjson_path(run_dir: str | os.PathLike[str], name: str) -> Path:
    return events_dir(run_dir) / f"{name}.ndjson"


def parquet_path(run_dir: str | os.PathLike[str], name: str) -> Path:
    return events_dir(run_dir) / f"{name}.parquet"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


# What a reader says after ``refused_file``'s reason.
REFUSED_HINT = ("not read (a run's files are read only when they are regular files inside its folder; "
                "replace a link with a copy of its file to read it)")


def refused_file(run_dir: str | os.PathLike[str], rel: str) -> str | None:
    """Why a reader must not open ``run_dir/rel`` (one line naming it), or None when it is
    a regular file reached without a symbolic link below ``run_dir``, or is missing.

    A run's writer makes only regular files and folders, but a run someone hands you can
    hold anything: a symbolic link (to ``~/.ssh/id_rsa``, or to another file of the run:
    one rule, and a link cannot be retargeted between this check and the read), a FIFO
    (opening it blocks for good), a device or a socket. Checked with ``lstat`` on each
    component of ``rel`` (which holds no ``..``), never by opening. ``run_dir`` itself may
    be reached through links: only what lies below it is checked.
    """
    path = os.fspath(run_dir)
    parts = rel.split("/")
    for i, part in enumerate(parts):  # one lstat a component below run_dir (no realpath: cheap)
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{rel} cannot be read ({e.strerror or e})"
        if stat.S_ISLNK(st.st_mode):
            if i == len(parts) - 1:
                return f"{rel} is a symbolic link (to {os.path.realpath(path)})"
            return f"{rel} leads through a symbolically linked folder ({'/'.join(parts[:i + 1])} -> " \
                   f"{os.path.realpath(path)})"
    if not stat.S_ISREG(st.st_mode):
        return f"{rel} is {_kind(st.st_mode)}, not a regular file"
    return None


def _regular(run_dir: str | os.PathLike[str], rel: str) -> os.stat_result | None:
    """The stat of ``run_dir/rel`` when a reader may open it (``refused_file``), else None."""
    if refused_file(run_dir, rel) is not None:
        return None
    try:
        return os.stat(Path(run_dir) / rel)
    except OSError:
        return None


@dataclasses.dataclass(frozen=True)
class CopyState:
    """How ``events/<name>.parquet`` relates to ``events/<name>.ndjson``.

    kind:
      none       no Parquet copy
      current    the copy was built from the NDJSON as it is now (same size)
      only       the NDJSON is missing (or empty while the copy has rows): the
                 copy is the only record of these events
      ahead      the NDJSON is shorter than when the copy was built: the copy
                 holds lines the NDJSON lost
      stale      the NDJSON grew since the copy was built (appended to later)
      unindexed  a copy without an index entry (compaction interrupted) beside
                 an NDJSON file
    """

    kind: str
    ndjson_bytes: int | None  # None: no NDJSON file
    built_from: int | None  # the NDJSON size the copy was built from (index), if known
    format_version: int  # of the copy's columns (1: before ADDED_COLUMNS)


def read_compaction_index(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """events/compaction.json, or an empty index when absent, unreadable or not a
    regular file (``refused_file``: a FIFO there must not block every reader)."""
    try:
        if _regular(run_dir, f"{EVENTS_DIR}/{COMPACTION_INDEX}") is None:
            raise FileNotFoundError
        index = json.loads((events_dir(run_dir) / COMPACTION_INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"files": {}}
    if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
        return {"files": {}}
    return index


def copy_state(run_dir: str | os.PathLike[str], name: str, index: dict[str, Any] | None = None) -> CopyState:
    """See CopyState; ``index`` is read_compaction_index(run_dir) when not given. A file
    that ``refused_file`` refuses (a link, a FIFO, a folder) counts as absent."""
    st = _regular(run_dir, f"{EVENTS_DIR}/{name}.ndjson")
    nd = st.st_size if st is not None else None
    if _regular(run_dir, f"{EVENTS_DIR}/{name}.parquet") is None:
        return CopyState("none", nd, None, FORMAT_VERSION)
    index = read_compaction_index(run_dir) if index is None else index
    entry = index["files"].get(name)
    fmt = index.get("format_version", 1)
    fmt = fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else 1
    built = entry.get("ndjson_bytes") if isinstance(entry, dict) else None
    if not isinstance(built, int) or isinstance(built, bool):
        built = None
    if built is None:
        # No index entry: the copy is still complete (each is renamed into place
        # whole) but its columns are unknown: the views look them up.
        fmt = 0
    if nd is None or (nd == 0 and built != 0):
        return CopyState("only", nd, built, fmt)
    if built is None:
        return CopyState("unindexed", nd, None, fmt)
    if nd == built:
        return CopyState("current", nd, built, fmt)
    return CopyState("stale" if nd > built else "ahead", nd, built, fmt)


def manifest_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / MANIFEST


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return manifest_path(path).is_file()


MAX_SEARCH_DEPTH = 6  # how deep find_run_dirs looks below the folder it is given


def find_run_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself if it is a run dir, else the run dirs below it, in subfolders too
    (``runs/ablation/<run-id>``; at most MAX_SEARCH_DEPTH levels; a run dir's own
    folders are not searched).

    Hidden entries (``.<id>.tmp`` directories of runs being created) are skipped; a
    folder reached twice through symlinks is searched once. Sorted by run id (its
    folder name), which is chronological because run ids start with a timestamp.
    """
    p = Path(path)
    if is_run_dir(p):
        return [p]
    found: list[Path] = []
    seen: set[str] = set()

    def walk(folder: Path, depth: int) -> None:
        try:
            real = os.path.realpath(folder)
            if real in seen:
                return
            seen.add(real)
            children = sorted(c for c in folder.iterdir() if not c.name.startswith(".") and c.is_dir())
        except OSError:  # unreadable folder: nothing found there
            return
        for c in children:
            if is_run_dir(c):
                found.append(c)
            elif depth < MAX_SEARCH_DEPTH:
                walk(c, depth + 1)

    if p.is_dir():
        walk(p, 1)
    return sorted(found, key=lambda d: (d.name, str(d)))


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def new_run_id(experiment: str, now: float | None = None) -> str:
    """``YYYYMMDD-HHMMSS-<experiment>-<6 hex>`` in UTC, e.g. ``20261121-211500-ask_e-3f2a1c``.

    The random suffix makes ids unique in practice; ``RunWriter.create`` also
    creates the directory exclusively and retries on a collision.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    name = _UNSAFE.sub("_", experiment).strip("._-")[:48] or "run"
    return f"{stamp}-{name}-{secrets.token_hex(3)}"


def utc_iso(t: float | None = None) -> str:
    """ISO-8601 UTC with microseconds and a ``Z`` suffix."""
    t = time.time() if t is None else t
    sec = int(t)
    micro = int(round((t - sec) * 1_000_000))
    if micro == 1_000_000:
        sec, micro = sec + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{micro:06d}Z"


def package_versions() -> dict[str, str | None]:
    """Versions of Python and the tracked distributions (None when not installed)."""
    return dict(_package_versions())


@functools.lru_cache(maxsize=1)  # metadata lookups cost ~30 ms; versions do not change in-process
def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in TRACKED_PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    if versions.get("askspec") is None:
        # Running from a source checkout (not installed): fall back to the module.
        try:
            import askspec

            versions["askspec"] = getattr(askspec, "__version__", None)
        except ImportError:
            pass
    return versions


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may be partial)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so readers see the old or the new file, never half.

    The temporary file lives in the same directory (``os.replace`` is only atomic
    within one file system) and is fsynced before the rename.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    data = json.dumps(obj, indent=2, ensure_ascii=False, default=str).encode("utf-8")
    try:
        with open(tmp, "wb") as f:
            f.write(data + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest as stored, unchecked (``load_manifest`` checks it)."""
    with open(manifest_path(run_dir), encoding="utf-8") as f:
        return json.load(f)


class RunDirError(ValueError):
    """A run directory cannot be used as asked; the message says why and what to do."""


class ManifestError(RunDirError):
    """A run's manifest.json is missing, not JSON, or has a field of the wrong type."""


_INT = (int,)
_STR_OR_NONE = (str, type(None))
# Manifest field -> accepted JSON types (bool is excluded from ints below) and
# whether it is required. Only what readers and a resume rely on is checked.
_MANIFEST_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "run_id": ((str,), True),
    "experiment_hash": ((str,), True),
    "status": ((str,), True),
    "seed": (_INT, True),
    "experiment": (_STR_OR_NONE, False),
    "format_version": ((int, type(None)), False),
    "planned_sessions": ((int, type(None)), False),
    "resumes": (_INT, False),
    "started_at": (_STR_OR_NONE, False),
    "ended_at": (_STR_OR_NONE, False),
    "roles": ((dict, type(None)), False),
    "params": ((dict, type(None)), False),
    "versions": ((dict, type(None)), False),
    "argv": ((list, type(None)), False),
    "history": ((list,), False),
    "repairs": ((list,), False),
    "quarantined": ((list,), False),
    "restored": ((list,), False),
    "spec_path": (_STR_OR_NONE, False),
    "overrides": ((dict, type(None)), False),
    "run_options": ((dict, type(None)), False),
    "totals": ((dict, type(None)), False),
    "duration_s": ((int, float, type(None)), False),
}
_RUN_OPTIONS: dict[str, tuple[type, ...]] = {
    "backend": _STR_OR_NONE, "replay": _STR_OR_NONE, "sessions": (int, type(None)),
    "max_tokens": (int, type(None)), "models": (dict, type(None)),
    "base_url": _STR_OR_NONE, "default_base_url": _STR_OR_NONE, "served_models": (dict, type(None)),
    "concurrency": (int, type(None)), "profile": _STR_OR_NONE, "data": (dict, type(None)),
}
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z?")


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _want(types: tuple[type, ...]) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def check_manifest(manifest: Any, where: str = MANIFEST) -> dict[str, Any]:
    """``manifest`` if it has the shape readers rely on; else ManifestError naming the field."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: expected a JSON object, found {_type_name(manifest)}")
    for key, (types, needed) in _MANIFEST_FIELDS.items():
        if key not in manifest:
            if needed:
                raise ManifestError(f"{where}: field '{key}' is missing")
            continue
        v = manifest[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ManifestError(f"{where}: field '{key}' must be {_want(types)}, not {_type_name(v)} {_short(v)}")
    if manifest["status"] not in RUN_STATUSES:
        raise ManifestError(f"{where}: field 'status' must be one of {', '.join(RUN_STATUSES)}, "
                            f"not {_short(manifest['status'])}")
    if isinstance(manifest.get("resumes"), int) and manifest["resumes"] < 0:
        raise ManifestError(f"{where}: field 'resumes' must not be negative")
    for key in ("started_at", "ended_at"):
        v = manifest.get(key)
        if isinstance(v, str) and not _TIMESTAMP.fullmatch(v):
            raise ManifestError(f"{where}: field '{key}' is not an ISO-8601 time: {_short(v)}")
    for key in ("history", "repairs", "quarantined", "restored"):
        for i, item in enumerate(manifest.get(key) or []):
            if not isinstance(item, dict):
                raise ManifestError(f"{where}: {key}[{i}] must be an object, not {_type_name(item)}")
    if any(not isinstance(a, str) for a in manifest.get("argv") or []):
        raise ManifestError(f"{where}: field 'argv' must be a list of strings")
    for key, types in _RUN_OPTIONS.items():
        v = (manifest.get("run_options") or {}).get(key)
        if not isinstance(v, types) or isinstance(v, bool):
            raise ManifestError(f"{where}: run_options.{key} must be {_want(types)}, not {_type_name(v)} {_short(v)}")
    return manifest


def _short(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def load_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's manifest, checked; ManifestError (one line, naming the file) if unusable."""
    path = manifest_path(run_dir)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ManifestError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        manifest = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:
        line, col = getattr(e, "lineno", None), getattr(e, "colno", None)
        where = f"{path}:{line}:{col}" if line else str(path)
        raise ManifestError(f"{where}: not valid JSON: {getattr(e, 'msg', e)}") from None
    return check_manifest(manifest, str(path))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
