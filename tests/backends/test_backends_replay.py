"""Replay backend: replies in call order per (session, role), clear errors when they run out
or the file is malformed."""

from __future__ import annotations

import asyncio
import json

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest
from askspec.runtime.backends.replay import ReplayBackend

RECORDING = {
    "sessions": [
        {"questioner": ["q0", "q1"], "judge": ["j0"]},
        {"questioner": ["second-session q0"]},
    ]
}


def _req(session: int, role: str, call: int) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": "hi"},), role=role,
                       session_index=session, call_index=call)


@pytest.fixture
def backend(tmp_path):
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(RECORDING))
    return ReplayBackend(file=str(path))


async def test_replies_follow_session_role_and_call_index(backend):
    assert (await backend.complete(_req(0, "questioner", 0))).text == "q0"
    assert (await backend.complete(_req(0, "judge", 0))).text == "j0"
    assert (await backend.complete(_req(0, "questioner", 1))).text == "q1"
    assert (await backend.complete(_req(1, "questioner", 0))).text == "second-session q0"


async def test_call_index_not_a_counter_so_retries_repeat(backend):
    first = await backend.complete(_req(0, "questioner", 1))
    again = await backend.complete(_req(0, "questioner", 1))
    assert first.text == again.text == "q1"
    assert first.finish_reason == "stop"


async def test_file_option_wins_over_model(tmp_path):
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(RECORDING))
    backend = ReplayBackend("smollm2-135m-instruct", file=str(path))
    assert (await backend.complete(_req(0, "judge", 0))).text == "j0"


async def test_model_names_the_file_without_option(tmp_path):
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(RECORDING))
    assert (await ReplayBackend(str(path)).complete(_req(0, "judge", 0))).text == "j0"


@pytest.mark.parametrize(
    ("session", "role", "call", "expected"),
    [
        (2, "questioner", 0, "has 2 session(s); session 2 (role 'questioner', call 1)"),
        (1, "judge", 0, "session 1 has no replies for role 'judge' (call 1); roles recorded there: 'questioner'"),
        (0, "questioner", 2, "session 0, role 'questioner' ran out of replies: call 3 asked but only 2 recorded"),
    ],
)
async def test_running_out_names_session_role_and_call(backend, session, role, call, expected):
    with pytest.raises(BackendError) as info:
        await backend.complete(_req(session, role, call))
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
        ("[]", 'expected an object {"sessions": [...]} at the top level'),
        ('{"sessions": {}}', '"sessions" must be a list, got an object'),
        ('{"sessions": [["a"]]}', "sessions[0] must be an object mapping role names to reply lists, got a list"),
        ('{"sessions": [{"judge": "yes"}]}', "sessions[0]['judge'] must be a list of strings, got a string"),
        ('{"sessions": [{}, {"judge": ["ok", 3]}]}', "sessions[1]['judge'][1] must be a string, got a number"),
    ],
)
def test_bad_files_are_rejected_on_load(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BackendError) as info:
        ReplayBackend(file=str(path))
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(BackendError, match="does not exist"):
        ReplayBackend(file=str(tmp_path / "nope.json"))


def test_no_file_named():
    with pytest.raises(BackendError, match="name the recording file"):
        ReplayBackend("")


# -- hostile files and the event loop ----------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[" * 100_000, "is nested too deeply to read"),
        ('{"sessions": [' + "1" * 5000 + "]}", "cannot be read as JSON: Exceeds the limit"),
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0: invalid start byte)"),
        ("", "is not valid JSON: Expecting value at line 1, column 1"),
    ],
    ids=["deep", "huge-int", "not-utf8", "empty"],
)
def test_malformed_files_name_the_file(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(BackendError) as info:
        ReplayBackend(file=str(path))
    assert str(info.value).startswith(f"replay file {str(path)!r} ")
    assert expected in str(info.value)


def test_special_files_are_refused_without_reading(tmp_path):
    import os

    fifo = tmp_path / "rec.fifo"
    os.mkfifo(fifo)  # reading it would block for good
    with pytest.raises(BackendError, match=r"is a FIFO \(named pipe\), not a regular file; a recording is a JSON file"):
        ReplayBackend(file=str(fifo))
    with pytest.raises(BackendError, match="is a character device, not a regular file"):
        ReplayBackend(file="/dev/zero")  # would never end
    with pytest.raises(BackendError, match="is a folder"):
        ReplayBackend(file=str(tmp_path))


def test_a_recording_past_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    """A recording is read whole and parsed: one past MAX_STATE_BYTES is refused, the
    limit named."""
    from askspec.runtime.backends import replay

    path = tmp_path / "big.json"
    path.write_text(json.dumps(RECORDING))
    monkeypatch.setattr(replay, "MAX_STATE_BYTES", 16)
    with pytest.raises(BackendError) as info:
        ReplayBackend(file=str(path))
    assert str(info.value) == (f"replay file {str(path)!r} is {path.stat().st_size} bytes; the limit is 16 bytes; "
                               f"a recording is a JSON file")


def test_a_byte_order_mark_is_tolerated(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(RECORDING).encode())
    assert ReplayBackend(file=str(path)).sessions[0]["judge"] == ["j0"]


async def test_a_session_of_replay_calls_can_be_cancelled(tmp_path):
    # The replies are at hand, so without a yield per call a session (here: 100,000
    # calls) would run to its end in one step of its task, deaf to cancellation (Ctrl-C).
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"sessions": [{"a": ["x"] * 100_000}]}))
    backend = ReplayBackend(file=str(path))
    answered = 0

    async def session() -> None:
        nonlocal answered
        for n in range(100_000):
            await backend.complete(_req(0, "a", n))
            answered += 1

    task = asyncio.ensure_future(session())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert answered < 100_000


# --------------------------------------------------------------- a spec's recording is confined

def _spec_folder(tmp_path):
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "rec.json").write_text(json.dumps(RECORDING))
    (tmp_path / "outside.json").write_text(json.dumps(RECORDING))
    (spec_dir / "link.json").symlink_to(tmp_path / "outside.json")
    return spec_dir


@pytest.mark.parametrize(("named", "why"), [
    ("../outside.json", "../outside.json is outside the spec's folder"),
    ("ABS", "is outside the spec's folder"),
    ("link.json", "link.json leads through a symlink to "),
])
def test_a_spec_recording_outside_the_spec_folder_is_refused(tmp_path, named, why):
    from askspec.runtime.backends.base import SpecContext

    spec_dir = _spec_folder(tmp_path)
    named = str(tmp_path / "outside.json") if named == "ABS" else named
    for model, options in ((named, {}), ("rec.json", {"file": named})):
        with pytest.raises(BackendError, match="replay file refused: .*" + why.replace(".", r"\.")):
            ReplayBackend.spec_options(model, options, SpecContext(spec_dir=str(spec_dir)))


def test_a_spec_recording_is_read_from_the_spec_folder_not_the_working_one(tmp_path, monkeypatch):
    from askspec.runtime.backends.base import SpecContext

    spec_dir = _spec_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rec.json").write_text("{}")  # (a file of the same name where askspec runs)
    options = ReplayBackend.spec_options("rec.json", {}, SpecContext(spec_dir=str(spec_dir)))
    assert options["file"] == str((spec_dir / "rec.json").resolve())
    # --replay FILE is the user's own choice, taken as given
    given = ReplayBackend.spec_options("rec.json", {}, SpecContext(spec_dir=str(spec_dir), replay="../x.json"))
    assert given["file"] == "../x.json"


def test_a_recording_named_on_the_command_line_may_lie_anywhere(tmp_path):
    from askspec.runtime.commands.run import run_spec

    spec_dir = _spec_folder(tmp_path)
    spec = spec_dir / "s.ask"
    spec.write_text('model m = replay("rec.json")\nrole questioner { model = m; prompt = "ask" }\n'
                    "game g {\n    ask questioner\n}\n")
    rc, run_dir = asyncio.run(run_spec(str(spec), eval_only=True, out=str(tmp_path / "runs"), sessions=1,
                                       model=[f"questioner=replay:{tmp_path / 'outside.json'}"]))
    assert rc == 0
    from pathlib import Path

    assert '"q0"' in (Path(run_dir) / "events" / "turns.ndjson").read_text()
