"""Recorded responses: answer each call from a JSON file, for tests and re-scoring past runs.

File format::

    {"sessions": [{"<role>": ["reply 1", "reply 2", ...], ...}, ...]}

Session k of the run (`request.session_index`) reads `sessions[k]`; a role's calls read its
list in order, indexed by `request.call_index` (the role's 0-based call number within the
session) rather than by a counter, so retries and resumed runs get the same replies.

A reply is at hand at once, so `complete` lets the event loop run every few ms
(`loop.let_loop_run`): without that, a session's whole game would run in one step of its
task and a run would finish before the loop got to look at Ctrl-C. Any file that is not such a recording
(not a regular file, not UTF-8, not JSON, nested past the parser, the wrong shape) is
refused when the backend is made, with an error naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from askspec.lang.paths import MAX_STATE_BYTES, FileRefused, read_regular, resolve_spec_path
from askspec.runtime.backends.base import Backend, BackendError, ChatRequest, ChatResult, SpecContext
from askspec.runtime.backends.loop import let_loop_run, loop_due


class ReplayBackend(Backend):
    """Replies from a recording: option `file` names the JSON file, else `model` does.

    (`file` wins because `--replay FILE` replays every model of a spec: `model` is then
    the weights name the spec gave, not a path.)
    """

    name = "replay"

    @classmethod
    def spec_options(cls, model: str, options: dict[str, Any], context: SpecContext) -> dict[str, Any]:
        """--replay FILE (the user's own path, as given) wins over the spec's `file`, which
        wins over the model name (`replay("answers.json")`). A path the spec gives is
        relative to the spec's folder and confined to it, like its templates and data
        (``askspec.lang.paths``; the checker's E304): a recording's replies become turns
        that other roles, and so their endpoints, are sent."""
        out = dict(options)
        file = context.replay or options.get("file") or model
        if not file:
            raise BackendError("the replay backend needs a recording: pass --replay FILE")
        if not context.replay:
            try:
                file = resolve_spec_path(context.spec_dir, file)
            except FileRefused as e:
                raise BackendError(f"replay file refused: {e} (a spec reads only files inside its own folder; "
                                   f"pass --replay FILE to use another recording)") from None
        out["file"] = file
        return out

    def __init__(self, model: str = "", *, file: str | os.PathLike[str] | None = None) -> None:
        source = file if file else model
        if not source:
            raise BackendError("replay backend: name the recording file (option 'file')")
        self.path = Path(source).expanduser()
        self.sessions = load_recording(self.path)

    def determinism(self, concurrency: int) -> dict[str, Any]:
        return {"level": "exact", "why": "replies are read from the recording by session, role and call number"}

    async def complete(self, request: ChatRequest) -> ChatResult:
        if loop_due():  # other sessions, signals, cancellation: every few ms
            await let_loop_run()
        k, role, n = request.session_index, request.role, request.call_index
        where = f"replay file {str(self.path)!r}"
        if not 0 <= k < len(self.sessions):
            raise BackendError(
                f"{where} has {len(self.sessions)} session(s); session {k} "
                f"(role {role!r}, call {n + 1}) has no recording"
            )
        replies = self.sessions[k].get(role)
        if replies is None:
            known = ", ".join(repr(r) for r in sorted(self.sessions[k])) or "none"
            raise BackendError(
                f"{where}: session {k} has no replies for role {role!r} "
                f"(call {n + 1}); roles recorded there: {known}"
            )
        if not 0 <= n < len(replies):
            raise BackendError(
                f"{where}: session {k}, role {role!r} ran out of replies: call {n + 1} "
                f"asked but only {len(replies)} recorded"
            )
        return ChatResult(text=replies[n], finish_reason="stop")


def load_recording(path: Path) -> list[dict[str, list[str]]]:
    """Read and validate a recording; every problem is a BackendError naming where it is."""
    where = f"replay file {str(path)!r}"
    try:
        # a regular file of at most MAX_STATE_BYTES: a FIFO would block the read for good,
        # /dev/zero would never end
        raw = read_regular(path, MAX_STATE_BYTES, shown=where)
    except FileNotFoundError:
        raise BackendError(f"{where} does not exist") from None
    except FileRefused as exc:
        raise BackendError(f"{exc}; a recording is a JSON file") from None
    except OSError as exc:
        raise BackendError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is tolerated
    except UnicodeDecodeError as exc:
        raise BackendError(f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BackendError(
            f"{where} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:
        raise BackendError(f"{where} is nested too deeply to read (a recording is 4 levels deep)") from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise BackendError(f"{where} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict) or "sessions" not in data:
        raise BackendError(f'{where}: expected an object {{"sessions": [...]}} at the top level')
    sessions = data["sessions"]
    if not isinstance(sessions, list):
        raise BackendError(f'{where}: "sessions" must be a list, got {json_kind(sessions)}')
    for k, session in enumerate(sessions):
        if not isinstance(session, dict):
            raise BackendError(
                f"{where}: sessions[{k}] must be an object mapping role names to reply "
                f"lists, got {json_kind(session)}"
            )
        for role, replies in session.items():
            if not isinstance(replies, list):
                raise BackendError(
                    f"{where}: sessions[{k}][{role!r}] must be a list of strings, got {json_kind(replies)}"
                )
            for n, reply in enumerate(replies):
                if not isinstance(reply, str):
                    raise BackendError(
                        f"{where}: sessions[{k}][{role!r}][{n}] must be a string, got {json_kind(reply)}"
                    )
    return sessions


def json_kind(value: Any) -> str:
    """How an error message names the JSON type of `value` ("an object", "null", ...)."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
