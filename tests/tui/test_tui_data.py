"""The TUI's data layer without a UI: the turn index (byte offsets by session), the
run mirror (read incrementally, same answers as the store's views), transcripts read
through the index or a Parquet copy, and rewards as the trainer uses them."""

from __future__ import annotations

import json
import os

import pytest

from askspec.runtime.store import layout
from askspec.runtime.store.compact import compact_run
from askspec.runtime.store.views import connect
from askspec.tui import data
from askspec.tui.index import LineIndex

from tui_helpers import _writer, build_demo_run


def _line(seq: int, sid: str, text: str) -> bytes:
    return (json.dumps({"seq": seq, "session_id": sid, "parsed": {"session_id": "decoy"}, "text": text})
            + "\n").encode()


def test_index_finds_a_sessions_lines_and_follows_appends(tmp_path):
    f = tmp_path / "turns.ndjson"
    f.write_bytes(_line(1, "a", "a0") + _line(2, "b", "b0") + _line(3, "a", "a1"))
    index = LineIndex(f)
    assert [json.loads(x)["text"] for x in index.lines("a")] == ["a0", "a1"]
    assert index.lines("decoy") == []  # a nested "session_id" is not the line's
    with open(f, "ab") as out:
        out.write(_line(4, "b", "b1") + b'{"seq": 5, "session_id": "a", "te')  # a line being written
    assert [json.loads(x)["text"] for x in index.lines("b")] == ["b0", "b1"]
    assert len(index.lines("a")) == 2  # the half-written line waits for its newline
    with open(f, "ab") as out:
        out.write(b'xt": "a2"}\n')
    assert [json.loads(x)["text"] for x in index.lines("a")] == ["a0", "a1", "a2"]


def test_index_of_escaped_ids_and_of_a_rewritten_file(tmp_path):
    f = tmp_path / "turns.ndjson"
    odd = 'q"uo\\te é'
    f.write_bytes(_line(1, odd, "odd") + _line(2, "b", "b0"))
    index = LineIndex(f)
    assert [json.loads(x)["text"] for x in index.lines(odd)] == ["odd"]
    # rewritten in place, same size, other order (a stale offset must not show another
    # session's line)
    with open(f, "r+b") as out:
        out.write(_line(2, "b", "b0") + _line(1, odd, "odd"))
    assert [json.loads(x)["text"] for x in index.lines("b")] == ["b0"]
    # replaced by a new file (as a resume that moved a damaged line out does)
    tmp = tmp_path / "new.ndjson"
    tmp.write_bytes(_line(1, "c", "c0"))
    os.replace(tmp, f)
    assert [json.loads(x)["text"] for x in index.lines("c")] == ["c0"] and index.lines("b") == []


def _play(w, i: int, turns: int = 2) -> None:
    """A session whose questioner keeps its whole conversation (stored as prompt deltas)."""
    sid = f"s{i:03d}"
    a = w.session_started(sid, game="g", group_id=None, params={"i": i}, index=i)
    history = [{"role": "system", "content": "Ask."}]
    for t in range(turns):
        history = history + [{"role": "user", "content": f"question {i}.{t}"}]
        w.turn(sid, a, turn_index=t, role="questioner", model="m", prompt=history, text=f"reply {i}.{t}",
               parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
        history = history + [{"role": "assistant", "content": f"reply {i}.{t}"}]
    w.reward(sid, a, role="questioner", turn_index=None, name="calibration", value=float(i), kind="terminal")
    w.session_finished(sid, a, status="ok", outcome="done", error=None, vars={})


def test_the_mirror_reads_only_what_was_appended(tmp_path):
    w = _writer(tmp_path / "runs", "live")
    for i in range(3):
        _play(w, i)
    w.flush()
    source = data.Source(tmp_path / "runs")
    run_id = data.list_runs(source)[0].run_id
    table = data.sessions_table(source, run_id)
    assert table.column("session").to_pylist() == ["s000", "s001", "s002"]
    assert table.column("questioner").to_pylist() == [0.0, 1.0, 2.0]
    mirror = source.mirror(run_id)
    read = mirror._tails["sessions"].offset
    assert read == layout.ndjson_path(w.run_dir, "sessions").stat().st_size
    for i in range(3, 5):
        _play(w, i)
    w.flush()
    table = data.sessions_table(source, run_id)
    assert table.column("session").to_pylist() == [f"s{i:03d}" for i in range(5)]
    assert mirror._tails["sessions"].offset > read
    assert mirror.refresh() is False  # nothing new: nothing read
    tr = data.transcript(source, run_id, "s004")
    assert [t.text for t in tr.turns] == ["reply 4.0", "reply 4.1"]
    w.finish()


@pytest.mark.parametrize("compacted", [False, True])
def test_a_transcript_reads_what_the_views_read(tmp_path, compacted):
    w = _writer(tmp_path / "runs", "both")
    for i in range(6):
        _play(w, i, turns=3)
    w.finish()
    if compacted:
        compact_run(w.run_dir)
    source = data.Source(tmp_path / "runs")
    run_id = data.list_runs(source)[0].run_id
    mirror = source.mirror(run_id)
    assert (mirror.turn_index is None) == compacted  # a compacted run reads its Parquet copy
    con = connect(tmp_path / "runs").con
    for sid in ("s000", "s003", "s005"):
        want = con.execute("SELECT turn_index, text, prompt FROM turns WHERE session_id = ? ORDER BY turn_index",
                           [sid]).fetchall()
        tr = data.transcript(source, run_id, sid)
        assert [(t.index, t.text, t.prompt) for t in tr.turns] == [(i, x, json.loads(p)) for i, x, p in want]
        assert len(tr.turns[-1].prompt) == 1 + 2 * 3 - 1  # rebuilt whole from its deltas
        assert tr.terminal_rewards == [("questioner", "calibration", float(sid[1:]))]


def test_rewards_are_shown_as_the_trainer_uses_them(tmp_path):
    """A group routed to a tournament: its members' tournament rewards replace their
    calibration rewards (per-turn rewards still count), in the sessions table, the
    run's mean, the group's members and the transcript."""
    run_dir = build_demo_run(tmp_path / "runs")
    source = data.Source(run_dir)
    run_id = data.list_runs(source)[0].run_id
    table = data.sessions_table(source, run_id)
    final = dict(zip(table.column("session").to_pylist(), table.column("questioner").to_pylist()))
    # s0-s3 in the routed group: tournament 0.6, 0.0, 1.0 (-0.05 format), 0.4; s4 kept its 1.0; s5 errored
    assert final.pop("s000005") is None
    assert final == pytest.approx({"s000000": 0.6, "s000001": 0.0, "s000002": 0.95, "s000003": 0.4, "s000004": 1.0})
    (info,) = data.summarize_runs(source)
    assert info.mean_reward["questioner"] == pytest.approx((0.6 + 0.0 + 0.95 + 0.4 + 1.0) / 5)
    assert data.run_info(source, run_id).mean_reward == info.mean_reward
    members = data.group_detail(source, run_id, "g0").members.to_pydict()
    assert members["final"] == pytest.approx([0.6, 0.0, 0.95, 0.4])
    assert members["base"] == pytest.approx([1.0, 0.2, -0.25, 1.0])  # what the verifier gave
    tr = data.transcript(source, run_id, "s000002")
    assert tr.totals == {"questioner": pytest.approx(0.95)}
    assert not tr.counts("questioner", "calibration") and tr.counts("questioner", "tournament")


def test_a_reply_too_long_to_store_inline_is_marked_in_the_transcript(tmp_path):
    from askspec.tui.components.turn import body

    w = _writer(tmp_path / "runs", "long")
    a = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    huge = "x" * (2 << 20)  # a server that ignored max_tokens
    w.turn("s0", a, turn_index=0, role="questioner", model="m", prompt=[], text=huge, parsed={},
           finish_reason="length", tokens_in=1, tokens_out=1, latency_ms=1.0)
    w.session_finished("s0", a, status="ok", outcome="done", error=None, vars={})
    w.finish()
    source = data.Source(tmp_path / "runs")
    (turn,) = data.transcript(source, data.list_runs(source)[0].run_id, "s0").turns
    assert len(turn.text) < 1000
    ((path, chars, file),) = turn.stored_aside
    assert (path, chars) == ("$.text", len(huge)) and (w.run_dir / "events" / file).stat().st_size == len(huge)
    assert f"✂ $.text is cut here: {len(huge):,} characters, whole in events/{file}" in body(turn).plain


@pytest.mark.parametrize("compacted", [False, True])
def test_a_large_runs_first_sessions_come_from_the_head_of_its_file(tmp_path, compacted, monkeypatch):
    """The sessions table's first paint: the first sessions in plan order, read from the
    head of the sessions file alone, are the first rows of the whole table; a small run
    (read whole at once) has no first page, nor a run whose sessions were read."""
    w = _writer(tmp_path / "runs", "big", planned_sessions=300)
    for i in range(300):
        sid = f"s{i:03d}"
        a = w.session_started(sid, game="g", group_id=None, params={"i": i}, index=i)
        if i % 50 != 7:  # a few still running when the head was written
            w.session_finished(sid, a, status="ok" if i % 3 else "error", outcome="done" if i % 3 else None,
                               error=None if i % 3 else "boom", vars={})
    w.finish()
    if compacted:
        compact_run(w.run_dir)
    source = data.Source(tmp_path / "runs")
    run_id = data.list_runs(source)[0].run_id
    size = layout.ndjson_path(w.run_dir, "sessions").stat().st_size
    assert data.first_sessions(source, run_id) is None  # small: no first page
    monkeypatch.setattr(data, "HEAD_BYTES", size // 3)  # the head: about 100 sessions' events
    monkeypatch.setattr(data, "HEAD_ROWS", 200)
    page = data.first_sessions(source, run_id, rows=50)
    assert page is not None and page.num_rows == 50
    whole = data.sessions_table(source, run_id, rewards=False)
    assert whole.num_rows == 300
    assert page.equals(whole.slice(0, 50))
    assert data.first_sessions(source, run_id) is None  # read whole now: no first page


# one group a step (group = 4, batch = 4): the step's reward std is its group's
STD_SPEC = """model m = hf("{model}") {{ max_tokens = 6; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "guess a number"; trained }}
game g for i in range(0, 4) {{
    x = ask a
    reward a = len(x.text) + i
}}
train a with grpo {{ group = 4; batch = 4; steps = 2; lr = 0.01{std} }}
"""


@pytest.mark.parametrize("std", ["", "population"])
def test_the_groups_tab_shows_the_std_train_steps_and_the_console_show(tiny_model, tmp_path, std):
    """The same std for the same group in the Groups tab, `train_steps.reward_std` and the
    console's step line: the train block's (sample by default, or its `std`)."""
    import subprocess
    import sys

    from askspec.ir.advantages import group_std
    from askspec.runtime.store.views import open_store
    from askspec.tui.numbers import number

    spec = tmp_path / "std.ask"
    spec.write_text(STD_SPEC.format(model=tiny_model, std=f"; std = {std}" if std else ""))
    env = {k: v for k, v in os.environ.items() if k not in ("ASKSPEC_DEBUG", "WANDB_API_KEY")}
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--out", str(tmp_path / "runs"),
                           "--seed", "3"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and not d.name.startswith(".")]
    con = open_store(run_dir)
    steps = dict(con.execute("SELECT step, reward_std FROM train_steps WHERE role = 'a'").fetchall())
    groups = dict(con.execute("SELECT DISTINCT step, group_id FROM sessions").fetchall())
    assert sorted(steps) == sorted(groups) == [1, 2]
    console = [ln for ln in done.stderr.splitlines() if ln.startswith("step ")]
    source = data.Source(tmp_path / "runs")
    (run,) = data.list_runs(source)
    spread = 0
    for (step, reward_std), line in zip(sorted(steps.items()), console):
        detail = data.group_detail(source, run.run_id, groups[step])
        (stats,) = [w for w in detail.why if w.startswith("a: count 4")]
        shown = stats.split(", std ")[1].split(",")[0]
        assert shown == number(reward_std), (stats, reward_std)
        assert f"± {reward_std:.3f}" in line, line
        assert f"({std or 'sample'} std)" in stats
        finals = detail.members.column("final").to_pylist()
        assert reward_std == pytest.approx(group_std(finals, std or "sample"), abs=1e-4)
        spread += max(finals) > min(finals)
    assert spread  # a group whose rewards differ: the two stds differ there
