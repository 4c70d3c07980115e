"""RunWriter: creates a run directory and appends events to its NDJSON files.

A running experiment never opens a DuckDB database; it only appends lines to
``events/*.ndjson`` (see layout.py), so any number of readers can query the run
while it is written.

Durability model
----------------
* Every line is complete before it reaches the file: events are serialised to
  one line each, buffered in memory, and written with ``os.write`` on an
  ``O_APPEND`` descriptor in whole lines only. A crash therefore loses at most
  the buffered events plus, in the worst case, leaves one partial last line
  (readers ignore it with a warning; ``open_for_resume`` moves it to the
  quarantine file before appending, so it can never glue onto a new event).
* Buffers are flushed when they exceed ``flush_bytes``, when an event arrives
  more than ``flush_interval`` seconds after the last flush, by a timer on the
  running asyncio loop (so a quiet engine still flushes within
  ``flush_interval``), and on ``flush()``/``finish()``. ``flush_interval=0``
  writes every event immediately (slower, loses nothing but the line in flight).
* Cross-file order within one flush is fixed so that a crash at any point
  leaves a consistent prefix: session *started* events, then turns, rewards,
  then session *finished* events, matches, groups, train steps. Hence a turn on
  disk always has its session's started line on disk (so a resume never reuses
  its attempt number), and a finished line on disk always has that session's
  turns and rewards on disk (so a session counted as done lost nothing).
  ``seq`` is assigned at flush time, so it increases in file order.
* A failed write (disk full, I/O error) is handled like a crash at that point:
  the rest of the buffer is dropped and the writer refuses further events;
  ``finish("failed")`` still records the end, and a later resume repairs the
  torn line and re-runs unfinished sessions.
* A line longer than ``overflow.LINE_CHARS`` has its long strings moved to
  side files first (overflow.py), so no reader chokes on it.

Resume: each ``session_started`` returns an attempt number, 1 + the highest
attempt seen for that session in earlier writer generations. The writer only
appends; before it does, ``open_for_resume`` makes the files complete and clean
(recover.py). The views keep each session's latest attempt.

Prompts: ``turn`` stores only what a prompt adds to the same role's previous
prompt in the session attempt (layout.py, ``prompt_chain``/``prompt_link``);
the turns view rebuilds the whole prompt.

Threading: a RunWriter is not thread-safe. Call it from one thread (the engine's
asyncio loop thread); no locks are taken because nothing else touches it. A
second *process* writing the same run is refused via an advisory lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import json.encoder
import operator
import os
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator

from askspec.runtime.store import faults, layout, liveness
from askspec.runtime.store.overflow import LINE_CHARS

# the single-writer lock lives in its own module so that compaction (which the writer
# calls at the end of a run) can take it without importing the writer
from askspec.runtime.store.lock import LOCK_FILE, RunLockedError, acquire_writer_lock, release_writer_lock  # noqa: F401

# Flush order (see module docstring). "sessions:pre" holds started events,
# "sessions:post" finished events; both go to sessions.ndjson.
_QUEUES = (
    ("sessions:pre", "sessions"),
    ("turns", "turns"),
    ("rewards", "rewards"),
    ("sessions:post", "sessions"),
    ("matches", "matches"),
    ("groups", "groups"),
    ("train_steps", "train_steps"),
    ("buffer_events", "buffer_events"),
    ("nested_events", "nested_events"),
)


def _json_default(o: Any) -> Any:
    # Engine values should be plain JSON, but a stray set, numpy scalar or
    # pydantic model must never crash an experiment mid-run.
    if isinstance(o, (set, frozenset)):
        try:
            return sorted(o)
        except TypeError:
            return list(o)
    if isinstance(o, bytes):
        return o.decode("utf-8", "replace")
    if isinstance(o, (_dt.datetime, _dt.date)):
        return o.isoformat()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if hasattr(o, "tolist"):  # numpy arrays and scalars
        return o.tolist()
    return str(o)


# A line is encoded in one call (`_LineFormat.body`): orjson, 5-10x faster than CPython's
# encoder on the small values of a turn, with dataclasses and datetimes passed to
# _json_default (orjson's own forms differ); what orjson refuses (non-string keys, integers
# beyond 64 bits, lone surrogates, nesting past 254 levels) goes to CPython's C encoder,
# called directly (skips building a JSONEncoder per call) with check_circular=False
# (engine values are trees; a cycle still fails loudly with RecursionError). orjson writes
# a non-finite float as null; the fallback path does the same (`_finite`), so no line ever
# holds a bare NaN or Infinity, which is not JSON.
_encode: Callable[[Any], str] = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), default=_json_default, check_circular=False
).encode
_enc_str: Callable[[str], str] = json.encoder.py_encode_basestring
# json's C accelerator: private names typeshed leaves out (getattr), None without _json (e.g. PyPy)
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encode_basestring = getattr(json.encoder, "c_encode_basestring", None)
if _c_make_encoder is not None and _c_encode_basestring is not None:
    try:
        _c_encoder = _c_make_encoder(None, _json_default, _c_encode_basestring, None, ":", ",", False, False, True)
    except TypeError:  # pragma: no cover - another signature: the pure-Python encoder above
        pass
    else:
        _enc_str = _c_encode_basestring

        def _c_encode(obj: Any) -> str:  # the fast path of _encode
            return "".join(_c_encoder(obj, 0))

        _encode = _c_encode

try:
    import orjson as _orjson

    _orjson_dumps: Callable[..., bytes] | None = _orjson.dumps
    _ORJSON_OPTIONS = _orjson.OPT_PASSTHROUGH_DATACLASS | _orjson.OPT_PASSTHROUGH_DATETIME
except ImportError:  # pragma: no cover - orjson is a dependency; without it, the C encoder alone
    _orjson_dumps = None


def _finite(x: Any) -> Any:
    """`x` with every non-finite float inside it replaced by None (what orjson writes)."""
    if type(x) is float:
        return x if x - x == 0.0 else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _s(x: Any) -> str:  # a VARCHAR value, encoded
    if type(x) is str:
        return _enc_str(x)
    return "null" if x is None else _enc_str(str(x))


def _as_str(x: Any) -> str:  # a VARCHAR column's value that is not a str
    return str(x)


def _as_int(x: Any) -> int | None:  # an INTEGER / BIGINT column's value that is not an int
    try:
        return operator.index(x)  # bool, numpy integers
    except TypeError:
        pass
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return int(f) if f.is_integer() else None


def _as_float(x: Any) -> float | None:  # a DOUBLE column's value that is not a float
    try:
        return float(x)  # a non-finite one is written as null
    except (TypeError, ValueError):
        return None


def _as_str_list(x: Any) -> list[str | None]:  # a VARCHAR[] column's value
    return [None if v is None else str(v) for v in x]


# a column's DuckDB type in layout.EVENT_SCHEMAS -> (the Python types written as they are,
# how any other value is made one of them)
_COLUMN_TYPES: dict[str, tuple[tuple[type, ...], Callable[[Any], Any]] | None] = {
    "VARCHAR": ((str,), _as_str),
    "INTEGER": ((int,), _as_int),
    "BIGINT": ((int,), _as_int),
    "DOUBLE": ((float, int), _as_float),
    "JSON": None,  # free-form: any JSON value, written as it is
    "VARCHAR[]": ((), _as_str_list),
}


class _LineFormat:
    """One event file's line body, from its columns in layout.EVENT_SCHEMAS (the one
    schema: a column's type there decides what is written). Each value is made its
    column's type, then the line is encoded in one call: orjson, which writes a
    non-finite float as null (a number column never holds a bare NaN, nor does a free-form
    value), else CPython's encoder for what orjson refuses (non-string keys, integers
    beyond 64 bits, nesting past 254 levels), with non-finite floats made null there too. A
    column the schema lacks is a bug, and raises."""

    __slots__ = ("event", "columns")

    def __init__(self, event: str) -> None:
        self.event = event
        self.columns = {col: _COLUMN_TYPES[t] for col, t in layout.EVENT_SCHEMAS[event].items()}

    def body(self, head: str, fields: dict[str, Any]) -> str:
        """The line after '"seq":N,' (spliced in at flush time): `head` (timestamp, run
        id, generation), then `fields`, which this may change in place."""
        columns = self.columns
        for col, value in fields.items():
            try:
                typed = columns[col]
            except KeyError:
                raise ValueError(f"{self.event} events have no column {col!r} (layout.EVENT_SCHEMAS)") from None
            if typed is not None and value is not None and type(value) not in typed[0]:
                fields[col] = typed[1](value)
        if _orjson_dumps is not None:
            try:
                return head + _orjson_dumps(fields, default=_json_default, option=_ORJSON_OPTIONS)[1:].decode()
            except TypeError:  # orjson.JSONEncodeError: refused (see above)
                pass
        return head + _encode(_finite(fields))[1:]


_LINES = {event: _LineFormat(event) for event in layout.EVENT_SCHEMAS}


@dataclasses.dataclass(slots=True)
class _PromptChain:
    """A role's prompts in one session attempt (see `RunWriter.turn`): the last prompt
    sent (a copy), the turn whose prompt is stored whole, and the last delta's number."""

    attempt: int
    last: list[Any]
    start: int
    link: int = 0

_write_all = layout.write_all  # a module global, so a test can make a write fail


def _str(x: Any) -> str | None:
    return x if x is None or isinstance(x, str) else str(x)


def _check_rel_path(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel.replace("\\", "/"))
    if not rel or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"spec file path must be relative and inside the spec: {rel!r}")
    return p


_D3 = tuple(f"{i:03}" for i in range(1000))  # "000" ... "999"


class _Clock:
    """ISO-8601 UTC timestamps, formatting the seconds part once per second."""

    __slots__ = ("_base", "_prefix")

    def __init__(self) -> None:
        self._base = -(1 << 62)  # the current second, in microseconds since the epoch
        self._prefix = ""

    def now(self) -> str:
        # integers throughout (cheaper than float arithmetic), and the fraction's six
        # digits from two table lookups rather than a format spec (~40% of a call)
        us = time.time_ns() // 1000 - self._base
        if not 0 <= us < 1_000_000:
            t = us + self._base
            sec = t // 1_000_000
            self._base = sec * 1_000_000
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(sec))
            us = t - self._base
        return f"{self._prefix}{_D3[us // 1000]}{_D3[us % 1000]}Z"


def _last_seq(path: Path) -> int:
    """The ``seq`` of the last parseable line of ``path`` (0 if none), reading from the end."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    chunk = 1 << 16
    with open(path, "rb") as f:
        while True:
            start = max(0, size - chunk)
            f.seek(start)
            data = f.read(size - start)
            lines = data.split(b"\n")
            # The first piece may be a partial line unless we read from offset 0.
            candidates = lines if start == 0 else lines[1:]
            for raw in reversed(candidates):
                if not raw.strip():
                    continue
                try:
                    seq = json.loads(raw).get("seq")
                except (ValueError, AttributeError):
                    continue
                if isinstance(seq, int):
                    return seq
            if start == 0:
                return 0
            chunk *= 4


def _scan_sessions(path: Path) -> tuple[dict[str, int], set[str]]:
    """Latest attempt per session and the sessions whose latest attempt finished."""
    attempts: dict[str, int] = {}
    finished: dict[str, int] = {}
    if not path.exists():
        return attempts, set()
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                continue  # partial last line from a crash
            try:
                ev = json.loads(raw)
                sid, att = ev["session_id"], int(ev["attempt"])
            except (ValueError, KeyError, TypeError):
                continue
            if att > attempts.get(sid, 0):
                attempts[sid] = att
            if ev.get("event") == "finished" and att > finished.get(sid, 0):
                finished[sid] = att
    done = {sid for sid, att in finished.items() if att >= attempts[sid]}
    return attempts, done


class RunWriter:
    """Appends the events of one run; see the module docstring for guarantees."""

    def __init__(
        self,
        run_dir: Path,
        manifest: dict[str, Any],
        *,
        gen: int,
        attempts: dict[str, int],
        completed: set[str],
        flush_interval: float,
        flush_bytes: int,
        lock_fd: int | None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.manifest = manifest
        self.run_id: str = manifest["run_id"]
        self.flush_interval = flush_interval
        self.flush_bytes = flush_bytes
        self._gen = gen
        self._attempts = attempts
        self._completed = completed
        self._lock_fd = lock_fd
        self._clock = _Clock()
        # The fields every line carries after "ts", encoded once.
        self._head = f'"run_id":{_s(self.run_id)},"gen":{int(gen)},'
        # session -> role -> (attempt, copy of the last prompt, turn where its chain
        # starts, its link number in the chain, model, the line's encoded fields from
        # session_id to prompt, around turn_index)
        self._prompts: dict[str, dict[str, _PromptChain]] = {}
        edir = layout.events_dir(self.run_dir)
        self._fds: dict[str, int] = {
            name: os.open(edir / f"{name}.ndjson", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            for name in layout.EVENT_NAMES
        }
        self._seq = {name: _last_seq(layout.ndjson_path(self.run_dir, name)) for name in layout.EVENT_NAMES}
        self._queues: dict[str, list[str]] = {q: [] for q, _ in _QUEUES}
        self._pending_bytes = 0
        self._armed = False  # a flush is already due (timer set, or no loop to set one on)
        self._timer: asyncio.TimerHandle | None = None
        self._last_flush = time.monotonic()
        self._closed = False
        self.notes: list[str] = []  # what open_for_resume repaired, one line each
        self._failed: BaseException | None = None  # a write error ends the writer's usefulness
        self._tokens = {"turns": 0, "tokens_in": 0, "tokens_out": 0}  # this generation's, added at finish
        # The manifest is rewritten by the engine's thread (annotate, finish) and by the
        # heartbeat's: one at a time, each write whole.
        self._manifest_lock = threading.Lock()
        self._stop_beat = threading.Event()
        threading.Thread(target=self._heartbeats, name=f"heartbeat {self.run_id}", daemon=True).start()

    # ------------------------------------------------------------------ creation

    @classmethod
    def create(
        cls,
        out_dir: str | os.PathLike[str],
        *,
        experiment: str,
        experiment_hash: str,
        ir_json: str,
        spec_files: dict[str, str],
        seed: int,
        roles: dict[str, dict],
        params: dict,
        planned_sessions: int,
        argv: list[str],
        fields: dict[str, Any] | None = None,
        flush_interval: float = 0.2,
        flush_bytes: int = 1 << 18,
    ) -> RunWriter:
        """Create ``<out_dir>/<run-id>/`` and return a writer for it.

        The directory is assembled under a hidden temporary name and renamed into
        place, so readers never see a half-created run. ``fields`` are the run-level
        facts of ``annotate`` (the options, a training run's record, ...): given here,
        the manifest is complete from the moment the run exists, so no crash leaves one
        that a resume would take for a different kind of run.
        """
        own = sorted(cls._OWN_FIELDS & set(fields or {}))
        if own:
            raise ValueError(f"manifest field(s) {', '.join(own)} are kept by the writer itself")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        checked = {_check_rel_path(rel): text for rel, text in spec_files.items()}
        started = layout.utc_iso()
        for _ in range(100):
            run_id = layout.new_run_id(experiment)
            final = out / run_id
            if final.exists():
                continue
            tmp = out / f".{run_id}.tmp"
            tmp.mkdir()
            spec_dir = tmp / layout.SPEC_DIR
            spec_dir.mkdir()
            for rel, text in checked.items():
                target = spec_dir.joinpath(*rel.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
            (tmp / layout.IR_JSON).write_text(ir_json, encoding="utf-8")
            (tmp / layout.IR_HASH).write_text(experiment_hash + "\n", encoding="utf-8")
            edir = tmp / layout.EVENTS_DIR
            edir.mkdir()
            # All event files exist from the start: readers opened early then see
            # lines that arrive later, and empty files simply give empty views.
            for name in layout.EVENT_NAMES:
                (edir / f"{name}.ndjson").touch()
            manifest = {
                "format_version": layout.FORMAT_VERSION,
                "run_id": run_id,
                "experiment": experiment,
                "experiment_hash": experiment_hash,
                "seed": seed,
                "roles": roles,
                "params": params,
                "planned_sessions": planned_sessions,
                "argv": list(argv),
                "versions": layout.package_versions(),
                "status": "running",
                "started_at": started,
                "ended_at": None,
                "resumes": 0,
                "history": [_process_entry(0, started, argv)],
                "repairs": [],
                **(fields or {}),
            }
            layout.write_json_atomic(tmp / layout.MANIFEST, manifest)
            faults.manifest_write()  # the run (and its manifest) exists once renamed into place
            try:
                os.rename(tmp, final)
            except OSError:  # another process took this id in the meantime
                _rmtree(tmp)
                continue
            lock_fd = acquire_writer_lock(final)
            return cls(
                final,
                manifest,
                gen=0,
                attempts={},
                completed=set(),
                flush_interval=flush_interval,
                flush_bytes=flush_bytes,
                lock_fd=lock_fd,
            )
        raise RuntimeError(f"could not allocate a unique run directory under {out}")

    @classmethod
    def open_for_resume(
        cls,
        run_dir: str | os.PathLike[str],
        *,
        argv: list[str] | None = None,
        flush_interval: float = 0.2,
        flush_bytes: int = 1 << 18,
    ) -> RunWriter:
        """Reopen an existing run for appending (after a crash or interruption).

        Checks the manifest (``layout.ManifestError``), makes the event files
        complete and clean (recover.py: NDJSON rebuilt from a Parquet copy that is
        the only record, redundant copies dropped, damaged lines quarantined; a
        ``layout.RunDirError`` when that cannot be done without losing data), sets
        the status back to ``running``, bumps the writer generation and learns
        each session's latest attempt. ``notes`` says what was repaired.
        """
        from askspec.runtime.store.recover import prepare_for_append

        run_dir = Path(run_dir)
        if not layout.is_run_dir(run_dir):
            raise FileNotFoundError(f"not a run directory (no manifest.json): {run_dir}")
        lock_fd = acquire_writer_lock(run_dir)
        try:
            manifest = layout.load_manifest(run_dir)
            gen = manifest.get("resumes", 0) + 1
            prepared = prepare_for_append(run_dir, manifest, gen)
            attempts, completed = _scan_sessions(layout.ndjson_path(run_dir, "sessions"))
            now = layout.utc_iso()
            history = list(manifest.get("history", []))
            if history and "status" not in history[-1]:
                # The previous process never called finish(): it died or was killed.
                prev = manifest.get("status")
                history[-1]["status"] = "interrupted" if prev == "running" else prev
                if prev == "running" and history[-1].get("ended_at") is None:
                    _account_killed(run_dir, manifest, history[-1], gen - 1)
            history.append(_process_entry(gen, now, argv or manifest.get("argv") or []))
            # Torn lines that older versions terminated in place ("repairs") are
            # damaged lines: the scan above has just quarantined them.
            manifest.update(status="running", ended_at=None, resumes=gen, history=history, repairs=[],
                            duration_s=liveness.run_seconds(history[:-1]))
            manifest.pop("closed_files", None)
            if prepared.restored:
                manifest["restored"] = list(manifest.get("restored", [])) + prepared.restored
            if prepared.quarantined:
                manifest["quarantined"] = list(manifest.get("quarantined", [])) + prepared.quarantined
            faults.manifest_write()
            layout.write_json_atomic(layout.manifest_path(run_dir), manifest)
        except BaseException:
            release_writer_lock(lock_fd)
            raise
        writer = cls(
            run_dir,
            manifest,
            gen=gen,
            attempts=attempts,
            completed=completed,
            flush_interval=flush_interval,
            flush_bytes=flush_bytes,
            lock_fd=lock_fd,
        )
        writer.notes = prepared.notes
        return writer

    # ------------------------------------------------------------------ events
    # Each method gives its event's fields to the event's `_LineFormat` (layout.EVENT_SCHEMAS);
    # the body starts after '"seq":N,' (seq is spliced in at flush time). Arguments keep
    # their historical names and order.

    def _head_now(self) -> str:
        return f'"ts":"{self._clock.now()}",{self._head}'

    def session_started(
        self, session_id: str, *, game: str, group_id: str | None, params: dict, index: int,
        step: int | None = None, stage: str | None = None, weights: str | None = None,
        seed: int | None = None,
    ) -> int:
        """Record the start of a session; returns its attempt number (1, 2, ...). ``step``,
        ``stage`` and ``weights`` are a training run's (engine.plan.SessionPlan); ``seed``
        is the session's sampling seed (any run's: the engine passes its plan's)."""
        attempt = self._attempts.get(session_id, 0) + 1
        self._attempts[session_id] = attempt
        self._completed.discard(session_id)
        self._prompts.pop(session_id, None)
        fields = {"event": "started", "session_id": session_id, "attempt": attempt, "index": index, "game": game,
                  "group_id": group_id, "params": params}
        if step is not None or stage is not None or weights is not None:  # an evaluation run's lines stay as they were
            fields.update(step=step, stage=stage, weights=weights)
        if seed is not None:
            fields["seed"] = seed
        self._emit("sessions:pre", _LINES["sessions"].body(self._head_now(), fields))
        return attempt

    def turn(
        self,
        session_id: str,
        attempt: int,
        *,
        turn_index: int,
        role: str,
        model: str | None,
        prompt: Any,
        text: str | None,
        parsed: dict | None,
        finish_reason: str | None,
        tokens_in: int | None,
        tokens_out: int | None,
        latency_ms: float | None,
        error: str | None = None,
        group_id: str | None = None,
        ttft_ms: float | None = None,
    ) -> None:
        """Record one model call. ``prompt`` is the full message list sent; only its
        difference from this role's previous prompt in the session is stored. A group
        route's judge call has ``group_id`` set and the group's id as its ``session_id``."""
        tokens = self._tokens
        tokens["turns"] += 1
        if type(tokens_in) is int:
            tokens["tokens_in"] += tokens_in
        if type(tokens_out) is int:
            tokens["tokens_out"] += tokens_out
        fields: dict[str, Any] = {"session_id": session_id, "attempt": attempt, "turn_index": turn_index,
                                  "role": role, "model": model}
        if type(prompt) is list and group_id is None:  # (a judge call's prompt is stored whole)
            roles = self._prompts.get(session_id)
            if roles is None:
                roles = self._prompts[session_id] = {}
            chain = roles.get(role)
            # A prompt that extends the previous one (memory = full) is stored as the new
            # messages only; anything else starts a new chain, stored whole. The chain
            # holds a copy, so an engine that later mutates its list cannot make a prefix
            # look shared when it is not.
            if (chain is not None and chain.attempt == attempt and (n := len(chain.last)) and len(prompt) >= n
                    and prompt[:n] == chain.last):
                chain.last = prompt[:]
                chain.link += 1
                fields.update(prompt=prompt[n:], prompt_chain=chain.start, prompt_link=chain.link)
            else:
                roles[role] = _PromptChain(attempt, prompt[:], turn_index)
                fields["prompt"] = prompt
        else:
            fields["prompt"] = prompt
        fields.update(text=text, parsed=parsed, finish_reason=finish_reason, tokens_in=tokens_in,
                      tokens_out=tokens_out, latency_ms=latency_ms, error=error)
        if group_id is not None:
            fields["group_id"] = group_id
        if ttft_ms is not None:  # absent (null) on backends that cannot tell
            fields["ttft_ms"] = ttft_ms
        self._emit("turns", _LINES["turns"].body(self._head_now(), fields))

    def reward(
        self,
        session_id: str,
        attempt: int,
        *,
        role: str,
        turn_index: int | None,
        name: str,
        value: float,
        kind: str,
    ) -> None:
        if kind not in ("turn", "terminal"):
            raise ValueError(f"reward kind must be 'turn' or 'terminal', not {kind!r}")
        self._emit("rewards", _LINES["rewards"].body(self._head_now(), {
            "session_id": session_id, "attempt": attempt, "role": role, "turn_index": turn_index, "name": name,
            "value": value, "kind": kind}))

    def session_finished(
        self,
        session_id: str,
        attempt: int,
        *,
        status: str,
        outcome: str | None,
        error: str | None,
        vars: dict,
        bookkeeping: dict | None = None,
    ) -> None:
        """Record a session's end. ``error`` sessions are recorded outcomes and count as done.
        ``vars`` are the spec's variables; ``bookkeeping`` the engine's own record."""
        if status not in ("ok", "error"):
            raise ValueError(f"session status must be 'ok' or 'error', not {status!r}")
        if attempt >= self._attempts.get(session_id, 0):
            self._completed.add(session_id)
        self._prompts.pop(session_id, None)
        self._emit("sessions:post", _LINES["sessions"].body(self._head_now(), {
            "event": "finished", "session_id": session_id, "attempt": attempt, "status": status, "outcome": outcome,
            "error": error, "vars": vars, "bookkeeping": bookkeeping}))

    def group(self, group_id: str, *, route: str, stats: dict, members: list[str], judge_calls: int | None = None,
              unparsed: int | None = None) -> None:
        self._emit("groups", _LINES["groups"].body(self._head_now(), {
            "group_id": group_id, "route": route, "stats": stats, "members": members, "judge_calls": judge_calls,
            "unparsed": unparsed}))

    def match(
        self,
        group_id: str,
        *,
        a: str,
        b: str,
        first_shown: str,
        verdict: str | None,
        outcome: float | None,
        raw: str | None,
    ) -> None:
        self._emit("matches", _LINES["matches"].body(self._head_now(), {
            "group_id": group_id, "a": a, "b": b, "first_shown": first_shown, "verdict": verdict, "outcome": outcome,
            "raw": raw}))

    def train_step(self, role: str, step: int, metrics: dict) -> None:
        # the flat columns (layout.TRAIN_STEP_COLUMNS) come from `metrics`, which is also kept whole
        fields: dict[str, Any] = {"role": role, "step": step}
        fields.update((k, metrics.get(k)) for k in layout.TRAIN_STEP_COLUMNS)
        fields["metrics"] = metrics
        self._emit("train_steps", _LINES["train_steps"].body(self._head_now(), fields))

    def buffer_event(self, *, buffer: str, event: str, item: int, value: Any = None, reason: str | None = None,
                     score: float | None = None, best: float | None = None, replays: int | None = None,
                     step: int | None = None, phase: str | None = None) -> None:
        self._emit("buffer_events", _LINES["buffer_events"].body(self._head_now(), {
            "buffer": buffer, "event": event, "item": item, "value": value, "reason": reason, "score": score,
            "best": best, "replays": replays, "step": step, "phase": phase}))

    def nested_event(self, *, step: int, event: str, dataset: int | None = None, copy: int | None = None,
                     inner_step: int | None = None, value: float | None = None, data: Any = None) -> None:
        self._emit("nested_events", _LINES["nested_events"].body(self._head_now(), {
            "step": step, "event": event, "dataset": dataset, "copy": copy, "inner_step": inner_step, "value": value,
            "data": data}))

    def _shrunk(self, body: str) -> str:
        # Rare path: a line over LINE_CHARS. Decode the line we built (exactly the
        # event as typed) and let overflow.shrink move its long strings out.
        from askspec.runtime.store.overflow import shrink

        event = json.loads("{" + body)
        return shrink(event, layout.events_dir(self.run_dir), _encode)[1:]

    # ------------------------------------------------------------------ run-level facts

    # Manifest fields only the writer sets (identity, status and its history).
    _OWN_FIELDS = frozenset({"format_version", "run_id", "experiment", "experiment_hash", "seed", "status",
                             "started_at", "ended_at", "resumes", "history", "repairs", "quarantined", "restored",
                             "versions", "totals", "duration_s"})

    def annotate(self, **fields: Any) -> None:
        """Record run-level facts in the manifest (the command's options, the model each
        role runs on, ...) and write it atomically. The writer's own fields (status,
        history, totals, ...) are not accepted here."""
        own = sorted(self._OWN_FIELDS & set(fields))
        if own:
            raise ValueError(f"manifest field(s) {', '.join(own)} are kept by the writer itself")
        if self._closed:
            raise ValueError(f"run writer for {self.run_id} is closed")
        with self._manifest_lock:
            self.manifest.update(fields)
            self._write_manifest()

    def _write_manifest(self) -> None:  # (holding the manifest lock)
        faults.manifest_write()
        layout.write_json_atomic(layout.manifest_path(self.run_dir), self.manifest)

    def _heartbeats(self) -> None:
        while not self._stop_beat.wait(liveness.HEARTBEAT_S):
            try:
                self.heartbeat()
            except Exception:  # the run dir gone, a full disk: the events are what matter; stop beating
                return

    def heartbeat(self) -> None:
        """Record in the manifest that this process is alive (``heartbeat_at`` in its
        history entry, with its totals so far): liveness.py tells a run whose process is
        gone by it. A thread calls this every ``liveness.HEARTBEAT_S`` seconds."""
        with self._manifest_lock:
            history = self.manifest.get("history")
            if self._closed or self.manifest.get("status") != "running" or not history:
                return
            history[-1].update(heartbeat_at=layout.utc_iso(), totals=dict(self._tokens))
            self._write_manifest()

    # ------------------------------------------------------------------ state

    def completed_sessions(self) -> set[str]:
        """Sessions whose latest attempt has a finished event (status ok or error)."""
        return set(self._completed)

    def attempts(self) -> dict[str, int]:
        """Latest attempt number per session seen so far (including earlier generations)."""
        return dict(self._attempts)

    @property
    def generation(self) -> int:
        return self._gen

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ flushing

    def _emit(self, queue: str, body: str) -> None:
        n = len(body)
        if n > LINE_CHARS or self._closed or self._failed is not None:  # (one test on the common path)
            if self._closed:
                raise ValueError(f"run writer for {self.run_id} is closed")
            if self._failed is not None:
                raise RuntimeError(f"run writer for {self.run_id} failed to write: {self._failed}")
            body = self._shrunk(body)
            n = len(body)
        self._queues[queue].append(body)
        pending = self._pending_bytes = self._pending_bytes + n
        if pending >= self.flush_bytes or time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()
        elif not self._armed:
            self._arm()

    def _arm(self) -> None:
        # First buffered event since the last flush: make sure it is written within
        # flush_interval even if no further event arrives. Only possible with a
        # running loop in this thread; otherwise the next event or flush() does it.
        self._armed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self.flush_interval, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._closed:
            self.flush()

    def flush(self) -> None:
        """Write all buffered events, in the crash-consistent file order."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed = False
        self._last_flush = time.monotonic()
        if not self._pending_bytes:
            return
        self._pending_bytes = 0
        for queue, name in _QUEUES:
            bodies = self._queues[queue]
            if not bodies:
                continue
            seq = self._seq[name]
            # Each body is a JSON object's fields after "seq", and its closing brace.
            lines = [f'{{"seq":{seq + i},{body}\n' for i, body in enumerate(bodies, 1)]
            self._seq[name] = seq + len(bodies)
            self._queues[queue] = []
            try:
                # "replace": a lone surrogate in model text must not abort the run.
                _write_all(self._fds[name], "".join(lines).encode("utf-8", "replace"))
            except BaseException as e:
                # Treat a failed write (disk full, I/O error) like a crash at this
                # point: drop what is still queued, so the files hold a consistent
                # prefix, and refuse further events. finish("failed") still works,
                # and open_for_resume terminates a torn line before appending.
                for q in self._queues:
                    self._queues[q] = []
                self._failed = e
                raise

    # ------------------------------------------------------------------ end

    def finish(self, status: str = "finished", *, compact: bool = False) -> None:
        """Flush, record the final status and end time, and release the run.

        ``compact=True`` then writes Parquet copies of the event files (see
        compact.py), which makes large runs much faster to query.
        """
        if status not in layout.RUN_STATUSES or status == "running":
            raise ValueError(f"final status must be finished, failed or interrupted, not {status!r}")
        if self._closed:
            return
        self.flush()
        self._stop_beat.set()
        with self._manifest_lock:
            self._record_end(status)
        self.close()
        if compact:
            from askspec.runtime.store.compact import compact_run  # only runs that finish are compacted

            compact_run(self.run_dir)

    def _record_end(self, status: str) -> None:
        now = layout.utc_iso()
        self.manifest["status"] = status
        self.manifest["ended_at"] = now
        if self._failed is None:
            # Every line these files hold was written whole by a writer: a resume
            # need not scan a file still exactly like this (check.file_stamp).
            from askspec.runtime.store.check import file_stamp

            self.manifest["closed_files"] = {
                name: file_stamp(layout.ndjson_path(self.run_dir, name)) for name in layout.EVENT_NAMES
            }
        if self.manifest.get("history"):
            self.manifest["history"][-1].update(ended_at=now, status=status, totals=dict(self._tokens))
        # Totals over every process that ran this run: tokens of all attempts (what the run
        # cost) and the time spent running (pauses between resumes left out). Each process
        # adds its own: a resume has added those of a process killed before its end.
        totals = dict(self.manifest.get("totals") or {})
        for key, n in self._tokens.items():
            totals[key] = int(totals.get(key) or 0) + n
        self._tokens = dict.fromkeys(self._tokens, 0)
        self.manifest["totals"] = totals
        self.manifest["duration_s"] = liveness.run_seconds(self.manifest.get("history") or [])
        self._write_manifest()

    def close(self) -> None:
        """Flush and close files without changing the manifest (status stays as is)."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._stop_beat.set()
            with self._manifest_lock:
                self._closed = True
            for fd in self._fds.values():
                os.close(fd)
            release_writer_lock(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.finish("finished")
        elif issubclass(exc_type, (KeyboardInterrupt, asyncio.CancelledError)):
            self.finish("interrupted")
        else:
            self.finish("failed")


def _process_entry(gen: int, started: str, argv: list[str]) -> dict[str, Any]:
    """A process's history entry as it starts: liveness.py checks its pid, host and heartbeat."""
    return {"gen": gen, "started_at": started, "pid": os.getpid(), "host": liveness.host(), "argv": list(argv),
            "heartbeat_at": started}


def _lines_from_end(path: Path, chunk: int = 1 << 16) -> Iterator[bytes]:
    """The complete lines of ``path``, last first."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        pos = f.seek(0, os.SEEK_END)
        rest = b""
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            lines = (f.read(pos - start) + rest).split(b"\n")
            pos = start
            rest = lines.pop(0) if start > 0 else b""
            for raw in reversed(lines):
                if raw.strip():
                    yield raw


def _event(raw: bytes) -> dict[str, Any] | None:
    try:
        ev = json.loads(raw)
    except ValueError:
        return None
    return ev if isinstance(ev, dict) else None


def _account_killed(run_dir: Path, manifest: dict[str, Any], process: dict[str, Any], gen: int) -> None:
    """Record the end of writer generation ``gen``, whose process died before ``finish``:
    its totals are counted from its turns on disk (a killed process's counters are lost;
    its lines are the last of the turns file, generations append in turn), added to the
    run's, and its end is its last sign of life (its heartbeat, or its last event)."""
    counted = {"turns": 0, "tokens_in": 0, "tokens_out": 0}
    ends = [t for t in (liveness.last_sign_of_life(process),) if t]
    for raw in _lines_from_end(layout.ndjson_path(run_dir, "turns")):
        ev = _event(raw)
        if ev is None:
            continue
        if ev.get("gen") != gen:
            if isinstance(ev.get("gen"), int) and ev["gen"] < gen:
                break
            continue
        counted["turns"] += 1
        for key in ("tokens_in", "tokens_out"):
            if type(ev.get(key)) is int:
                counted[key] += ev[key]
    for name in layout.EVENT_NAMES:  # the last event it wrote in any file
        for raw in _lines_from_end(layout.ndjson_path(run_dir, name)):
            ev = _event(raw)
            if ev is not None and ev.get("gen") == gen and isinstance(ev.get("ts"), str):
                ends.append(ev["ts"])
            break
    totals = dict(manifest.get("totals") or {})
    for key, n in counted.items():
        totals[key] = int(totals.get(key) or 0) + n
    manifest["totals"] = totals
    process["totals"] = counted
    process["killed"] = True  # ended without recording its end: ended_at is its last sign of life
    if ends:
        process["ended_at"] = max(ends, key=lambda t: liveness.seconds(t) or 0.0)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
