"""RunWriter: run directory layout, manifest, line format, buffering and crash order."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from pathlib import Path

import pytest

from askspec.runtime.store import layout, writer as writer_mod
from askspec.runtime.store.writer import RunLockedError, RunWriter

RUN_ID = re.compile(r"^\d{8}-\d{6}-demo-[0-9a-f]{6}$")


def read_lines(run_dir: Path, name: str) -> list[dict]:
    data = layout.ndjson_path(run_dir, name).read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_create_layout_and_manifest(kit, tmp_path):
    w = kit.new_writer(tmp_path / "out")
    rd = w.run_dir
    assert RUN_ID.match(w.run_id) and rd.name == w.run_id and rd.parent == tmp_path / "out"
    assert (rd / "spec" / "demo.ask").read_text() == "experiment demo { param probes = 2 }\n"
    assert (rd / "spec" / "prompts" / "demo" / "ask.j2").read_text() == "Ask about {{ topic }}.\n"
    assert json.loads((rd / "ir.json").read_text()) == {"experiment": "demo"}
    assert (rd / "ir.hash").read_text().strip() == "f00dfeed" * 8
    for name in layout.EVENT_NAMES:
        assert layout.ndjson_path(rd, name).read_bytes() == b""
    m = json.loads((rd / "manifest.json").read_text())
    assert m == w.manifest
    assert m["run_id"] == w.run_id and m["experiment"] == "demo" and m["seed"] == 7
    assert m["status"] == "running" and m["ended_at"] is None
    assert m["roles"]["questioner"] == {"backend": "replay", "model": "smollm2-135m"}
    assert m["planned_sessions"] == 4 and m["argv"][:2] == ["askspec", "run"]
    assert m["params"] == {"probes": 2}
    v = m["versions"]
    assert v["python"] and v["duckdb"] and "vllm" in v and "torch" in v and "transformers" in v
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$", m["started_at"])
    # No temporary directories are left behind.
    assert [p.name for p in (tmp_path / "out").iterdir()] == [w.run_id]
    w.finish("finished")
    m = json.loads((rd / "manifest.json").read_text())
    assert m["status"] == "finished" and m["ended_at"] >= m["started_at"]
    assert m["history"][-1]["status"] == "finished"


def test_run_ids_are_unique(kit, tmp_path):
    writers = [kit.new_writer(tmp_path) for _ in range(25)]
    assert len({w.run_id for w in writers}) == 25
    for w in writers:
        w.close()


@pytest.mark.parametrize("bad", ["../escape.ask", "/abs/x.ask", "a/../../b"])
def test_spec_paths_must_stay_inside(kit, tmp_path, bad):
    with pytest.raises(ValueError):
        kit.new_writer(tmp_path, spec_files={bad: "x"})


def test_event_lines(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    for i in range(3):
        kit.play_session(w, i)
    w.group("g0", route="verifier", stats={"var": 0.25, "n": 2}, members=["s0", "s1"])
    w.match("g0", a="s0", b="s1", first_shown="a", verdict="Tie", outcome=0.5, raw="tie")
    w.train_step("questioner", 1, {"loss": 1.0, "lr": 1e-6})
    w.buffer_event(buffer="kept", event="push", item=0, value={"q": 1}, replays=0, step=1, phase="proposer")
    w.nested_event(step=1, event="dataset", dataset=1, value=0.25, data={"pairs": [{"question": "1+1", "answer": "2"}]})
    w.finish()
    ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
    for name in layout.EVENT_NAMES:
        lines = read_lines(w.run_dir, name)
        assert lines, name
        assert [ev["seq"] for ev in lines] == list(range(1, len(lines) + 1))
        for ev in lines:
            assert ev["run_id"] == w.run_id and ev["gen"] == 0 and ts.match(ev["ts"])
            assert set(ev) <= set(layout.columns(name)), set(ev) - set(layout.columns(name))
    sessions = read_lines(w.run_dir, "sessions")
    assert [e["event"] for e in sessions].count("started") == 3
    started = {e["session_id"]: e["seq"] for e in sessions if e["event"] == "started"}
    finished = {e["session_id"]: e["seq"] for e in sessions if e["event"] == "finished"}
    assert all(started[s] < finished[s] for s in finished)
    t = read_lines(w.run_dir, "turns")[0]
    assert t["prompt"] == [{"role": "user", "content": "q0.0 attempt 1"}]
    assert t["parsed"] == {"question": "0+0"} and t["attempt"] == 1
    term = [r for r in read_lines(w.run_dir, "rewards") if r["kind"] == "terminal"][0]
    assert term["turn_index"] is None and term["value"] == 1.0
    assert read_lines(w.run_dir, "groups")[0]["members"] == ["s0", "s1"]


def test_completed_sessions_and_attempts(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    kit.play_session(w, 0)
    kit.play_session(w, 1, status="error", outcome=None)
    kit.play_session(w, 2, finish=False)
    assert w.completed_sessions() == {"s0", "s1"}  # errors are recorded outcomes
    assert w.attempts() == {"s0": 1, "s1": 1, "s2": 1}
    w.close()


def test_values_that_are_not_plain_json(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)

    class Model:
        def model_dump(self, mode="python"):
            return {"x": 1}

    a = w.session_started("s", game="g", group_id=None,
                          params={"set": {3, 1, 2}, "path": Path("/a/b"), "m": Model()}, index=0)
    w.reward("s", a, role="r", turn_index=None, name="nan", value=float("nan"), kind="terminal")
    w.turn("s", a, turn_index=0, role="r", model=None, prompt=[], text="lone \ud800 surrogate",
           parsed=None, finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    ev = read_lines(w.run_dir, "sessions")[0]
    assert ev["params"] == {"set": [1, 2, 3], "path": "/a/b", "m": {"x": 1}}
    assert read_lines(w.run_dir, "rewards")[0]["value"] is None  # a number column never holds a bare NaN
    assert read_lines(w.run_dir, "turns")[0]["text"] == "lone ? surrogate"
    with pytest.raises(ValueError):
        w.reward("s", a, role="r", turn_index=None, name="x", value=1, kind="bonus")
    with pytest.raises(ValueError):
        w.session_finished("s", a, status="done", outcome=None, error=None, vars={})
    w.finish("failed")
    with pytest.raises(ValueError):
        w.turn("s", a, turn_index=1, role="r", model=None, prompt=[], text="", parsed=None,
               finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)


def test_buffering_flushes_whole_lines_only(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=3600, flush_bytes=1 << 30)
    kit.play_session(w, 0)
    assert layout.ndjson_path(w.run_dir, "turns").read_bytes() == b""  # still buffered
    w.flush()
    assert len(read_lines(w.run_dir, "turns")) == 2
    # Size threshold: a small flush_bytes writes as events arrive.
    w.flush_bytes = 1
    kit.play_session(w, 1)
    assert len(read_lines(w.run_dir, "turns")) == 4
    w.close()


def test_asyncio_timer_bounds_the_flush_delay(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0.05, flush_bytes=1 << 30)

    async def main():
        w.session_started("s", game="g", group_id=None, params={}, index=0)
        await asyncio.sleep(0.01)
        assert layout.ndjson_path(w.run_dir, "sessions").read_bytes() == b""
        await asyncio.sleep(0.2)  # no further events: the loop timer must flush

    asyncio.run(main())
    assert len(read_lines(w.run_dir, "sessions")) == 1
    w.close()


def test_crash_during_flush_leaves_a_consistent_prefix(kit, tmp_path, monkeypatch):
    """Whatever file write a crash interrupts, a turn on disk has its started line and
    a finished line on disk has all of its session's turns and rewards."""
    real = writer_mod._write_all
    for crash_at in range(1, 5):  # four non-empty queues: pre, turns, rewards, post
        w = kit.new_writer(tmp_path / str(crash_at), flush_interval=3600, flush_bytes=1 << 30)
        kit.play_session(w, 0)
        kit.play_session(w, 1)
        calls = {"n": 0}

        def crashing(fd, data, calls=calls, crash_at=crash_at):
            calls["n"] += 1
            if calls["n"] == crash_at:
                real(fd, data[: len(data) // 2])  # torn write, then the process dies
                raise SystemExit("crash")
            real(fd, data)

        monkeypatch.setattr(writer_mod, "_write_all", crashing)
        with pytest.raises(SystemExit):
            w.flush()
        monkeypatch.setattr(writer_mod, "_write_all", real)
        for fd in w._fds.values():
            os.close(fd)
        writer_mod.release_writer_lock(w._lock_fd)

        def complete(name):
            data = layout.ndjson_path(w.run_dir, name).read_bytes()
            return [json.loads(x) for x in data.split(b"\n")[:-1]]  # drop the torn tail

        sessions = complete("sessions")
        started = {e["session_id"] for e in sessions if e["event"] == "started"}
        finished = {e["session_id"] for e in sessions if e["event"] == "finished"}
        turns = complete("turns")
        rewards = complete("rewards")
        assert {t["session_id"] for t in turns} <= started
        for sid in finished:
            assert sum(t["session_id"] == sid for t in turns) == 2
            assert sum(r["session_id"] == sid for r in rewards) == 3


def test_second_writer_process_is_refused(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    with pytest.raises(RunLockedError):
        RunWriter.open_for_resume(w.run_dir)
    w.close()
    RunWriter.open_for_resume(w.run_dir).close()


def test_context_manager_records_failure(kit, tmp_path):
    with pytest.raises(RuntimeError):
        with kit.new_writer(tmp_path) as w:
            raise RuntimeError("engine bug")
    assert layout.read_manifest(w.run_dir)["status"] == "failed"
    with kit.new_writer(tmp_path / "b") as w2:
        pass
    assert layout.read_manifest(w2.run_dir)["status"] == "finished"


def test_failed_write_leaves_a_consistent_prefix(kit, tmp_path, monkeypatch):
    """A write that fails half-way (disk full) acts like a crash: what is queued is dropped,
    later events are refused, and a resume terminates the torn line before appending."""
    from askspec.runtime.store.views import DamagedRunWarning, connect

    w = kit.new_writer(tmp_path, flush_interval=3600, flush_bytes=1 << 30)
    kit.play_session(w, 0)
    real = writer_mod._write_all

    def disk_full(fd, data):
        real(fd, data[:40])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_mod, "_write_all", disk_full)
    with pytest.raises(OSError):
        w.flush()  # the started line is torn; nothing after it is written
    monkeypatch.setattr(writer_mod, "_write_all", real)
    with pytest.raises(RuntimeError, match="failed to write"):
        kit.play_session(w, 1)
    w.finish("failed")
    for name in ("turns", "rewards"):
        assert layout.ndjson_path(w.run_dir, name).read_bytes() == b""
    w = RunWriter.open_for_resume(w.run_dir, flush_interval=0)
    assert w.attempts() == {}
    assert kit.play_session(w, 0) == 1
    w.finish()
    raw = layout.ndjson_path(w.run_dir, "sessions").read_bytes()
    assert raw.startswith(b'{"seq":1,') and all(json.loads(line) for line in raw.splitlines())
    assert layout.read_manifest(w.run_dir)["quarantined"] == [{"file": "sessions.ndjson", "lines": 1, "gen": 1}]
    (q,) = read_lines(w.run_dir, "quarantine")
    assert q["offset"] == 0 and len(q["raw"]) == 40 and q["line"] == 1
    store = connect(w.run_dir)
    assert [c for c, _ in store.warnings] == [DamagedRunWarning]
    assert store.con.execute("SELECT list(status) FROM sessions").fetchone() == (["ok"],)
    assert store.con.execute("SELECT count(*) FROM turns").fetchone() == (2,)


def test_free_form_values_read_back_as_the_c_encoder_wrote_them(kit, tmp_path):
    """A line is encoded by orjson where it can, else by the C encoder (writer._LineFormat):
    either way a free-form value reads back the same, value for value, including where
    orjson refuses (non-string keys, huge integers, lone surrogates, deep nesting) or needs
    _json_default (dataclasses, datetimes, sets); a non-finite float is null on both paths
    (never a bare NaN, which is not JSON)."""
    import dataclasses
    import datetime

    @dataclasses.dataclass
    class Point:
        x: int
        y: float

    deep: list = []
    node = deep
    for _ in range(300):  # past orjson's nesting limit
        node.append([])
        node = node[0]
    values = [
        {"question": "Wie viel ist 6·7? ✓", "parsed": True, "truncated": False},
        [{"role": "user", "content": "a \"quoted\" line\nand a tab\t"}],
        {1: "int key", "s": "str key"},
        {"big": 2 ** 70, "neg": -(2 ** 65)},
        {"point": Point(1, 2.5), "when": datetime.datetime(2026, 11, 23, 9, 0, 0, 123456),
         "day": datetime.date(2026, 11, 23), "set": {3, 1, 2}, "tuple": (1, "a")},
        {"lone": "x \ud800 y"},
        {"floats": [0.1, 1e-07, 1e16, 123456789.125, -0.0]},
        deep,
    ]
    line = writer_mod._LINES["turns"]
    for value in values:
        written = json.loads("{" + line.body("", {"parsed": value}))["parsed"]
        assert written == json.loads(writer_mod._encode(value)), value
    for value in ({"score": float("nan"), "best": float("inf"), "worst": float("-inf"), "none": None},
                  {1: [float("nan")], "s": 2 ** 70}):  # the orjson path, and the fallback path
        encoded = line.body("", {"parsed": value})
        assert "NaN" not in encoded and "Infinity" not in encoded
        assert None in json.loads("{" + encoded)["parsed"].values() or json.loads("{" + encoded)["parsed"]["1"] == [None]
    w = kit.new_writer(tmp_path, flush_interval=0)
    a = w.session_started("s", game="g", group_id=None, params={}, index=0)
    w.turn("s", a, turn_index=0, role="r", model="m", prompt=[{"role": "user", "content": "hi"}], text="t",
           parsed={"value": float("nan"), "answer": "42"}, finish_reason="stop", tokens_in=1, tokens_out=1,
           latency_ms=1.0)
    (line_read,) = read_lines(w.run_dir, "turns")
    assert line_read["parsed"]["value"] is None and line_read["parsed"]["answer"] == "42"
    w.close()


def test_a_column_the_schema_lacks_is_refused(kit, tmp_path):
    """The line formats come from layout.EVENT_SCHEMAS: a field it does not declare is a bug."""
    with pytest.raises(ValueError, match="no column 'bogus'"):
        writer_mod._LINES["rewards"].body("", {"session_id": "s", "bogus": 1})
