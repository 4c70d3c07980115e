"""Buffer evictions carried out (issue #11 item 4): each mode on scripted replays, by the
buffer type itself and end to end through the engine and the run store's
`buffer_events` / `buffer_items` views (a python-backed fake model scripts the replies)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from askspec.runtime.commands.run import run_spec
from askspec.runtime.scoring.buffers import ReplayBuffer
from askspec.runtime.store.views import open_store


def filled(eviction: str, n: int = 3, capacity: int = 10, patience: int = 2):
    events: list[dict] = []
    buf = ReplayBuffer("b", capacity, eviction, patience, on_event=events.append)
    for k in range(n):
        buf.add({"q": k})
    return buf, events


def evicted(events):
    return [(e["item"], e["reason"]) for e in events if e["event"] == "evict"]


def test_oldest_makes_room_and_none_refuses():
    buf, events = filled("oldest", n=5, capacity=3)
    assert buf.ids == [2, 3, 4] and [x["q"] for x in buf.items] == [2, 3, 4]
    assert evicted(events) == [(0, "capacity"), (1, "capacity")]
    buf, events = filled("none", n=5, capacity=3)
    assert buf.ids == [0, 1, 2] and not evicted(events)
    assert [(e["item"], e["reason"]) for e in events if e["event"] == "rejected"] == [(3, "full"), (4, "full")]
    for item_id in (0, 1, 2):  # replays never evict under oldest / none
        assert buf.replayed(item_id, 1.0) is None
    assert buf.ids == [0, 1, 2]


def test_solved_evicts_at_accuracy_one_only():
    buf, events = filled("solved")
    assert buf.replayed(0, 0.5) is None and buf.replayed(1, 1.0) == "solved" and buf.replayed(2, 0.0) is None
    assert buf.replayed(0, 0.5) is None and buf.replayed(0, 0.5) is None  # no peak, but not this mode
    assert buf.ids == [0, 2] and evicted(events) == [(1, "solved")]
    ev = next(e for e in events if e["event"] == "evict")
    assert ev["score"] == 1.0 and ev["value"] == {"q": 1} and ev["replays"] == 1


def test_no_peak_after_patience_replays_without_a_new_best():
    buf, events = filled("no_peak", patience=2)
    assert buf.replayed(0, 0.2) is None  # first replay: the best
    assert buf.replayed(0, 0.5) is None  # new best
    assert buf.replayed(0, 0.5) is None  # 1 without a new best
    assert buf.replayed(0, 0.4) == "no_peak"  # 2 = patience
    assert buf.replayed(1, 1.0) is None  # solved is not this mode
    assert evicted(events) == [(0, "no_peak")] and buf.ids == [1, 2]


def test_a_best_field_seeds_the_peak_at_push():
    """PasoDoble Alg. 2 l.19: a question enters the buffer with prev_acc = p_i, so a first
    replay that does not beat p_i already counts towards c (without `best_field` the first
    replay would set the peak)."""
    events: list[dict] = []
    buf = ReplayBuffer("b", 10, "no_peak", 2, on_event=events.append, best_field="pass_rate")
    buf.add({"q": 0, "pass_rate": 0.5})
    buf.add({"q": 1, "pass_rate": 0.2})
    assert events[0]["best"] == 0.5  # the push event reports the seeded peak
    assert buf.replayed(0, 0.5) is None  # not above p_i: 1 without a new peak
    assert buf.replayed(0, 0.3) == "no_peak"  # 2 = patience
    assert buf.replayed(1, 0.5) is None and buf.stats[1]["best"] == 0.5  # above p_i: a new peak
    unseeded = ReplayBuffer("b", 10, "no_peak", 2)
    unseeded.add({"q": 0, "pass_rate": 0.5})
    assert unseeded.replayed(0, 0.5) is None and unseeded.replayed(0, 0.3) is None  # the first replay set it


@pytest.mark.parametrize("best, code, message", [
    ("missing", "E101", "best names a field of buffer 'b'"),
    ("q", "E201", "best names a number field; 'q' is string"),
])
def test_best_names_a_number_field_of_the_buffer(best, code, message):
    from askspec.lang.compiler import compile_source

    src = ('model m = hf("smollm2-135m-instruct")\nrole r { model = m; prompt = "Answer." }\n'
           f'buffer b {{ capacity = 4; fields = {{q: string, p: number}}; best = {best} }}\n'
           'game g {\n    x = ask r\n    push b: {q: x.text, p: 0.5}\n}\n')
    errors = [(d.code, d.message) for d in compile_source("t.ask", src).sink.sorted() if d.is_error]
    assert errors == [(code, message)]


def test_solved_or_no_peak_evicts_on_either():
    buf, events = filled("solved_or_no_peak", patience=1)
    assert buf.replayed(0, 1.0) == "solved"
    assert buf.replayed(1, 0.3) is None and buf.replayed(1, 0.3) == "no_peak"
    assert buf.replayed(2, 0.3) is None and buf.replayed(2, 0.6) is None
    assert evicted(events) == [(0, "solved"), (1, "no_peak")] and buf.ids == [2]


def test_circular_replay_and_state_round_trip():
    buf, _ = filled("solved", n=3)
    assert [i for i, _ in buf.next_batch(2)] == [0, 1]
    buf.replayed(1, 1.0)  # item 1 leaves: the cursor stays on the next item
    assert [i for i, _ in buf.next_batch(2)] == [2, 0]
    items = buf.items
    again = ReplayBuffer("b", 10, "solved")
    again.items = items  # the list object expressions hold
    again.restore(json.loads(json.dumps(buf.state())))
    assert again.items is items and again.ids == buf.ids and again.cursor == buf.cursor
    assert [i for i, _ in again.next_batch(3)] == [i for i, _ in buf.next_batch(3)]


# ---------------------------------------------------------------- through the engine

SPEC = """
param eviction: string = "oldest"
buffer kept {{ capacity = {capacity}; eviction = eviction; patience = 1; score = acc; fields = {{q: number, answer: string}} }}
model m = python("fake_models:always_one")
role a {{ model = m; memory = none; reply = boxed }}
game fill for i in [1, 2, 3, 4] {{
    push kept: {{q: i, answer: case {{ i % 2 == 1 -> "1"; else -> "2" }}}}
}}
game first for item in kept {{
    r = ask a using "{{{{ item.q }}}}"
    acc = case {{ equiv(r.answer, item.answer) -> 1.0; else -> 0.0 }}
}}
game second for item in kept {{
    r = ask a using "{{{{ item.q }}}}"
    acc = case {{ equiv(r.answer, item.answer) -> 1.0; else -> 0.0 }}
}}
"""


def play(tmp_path: Path, eviction: str, capacity: int = 10):
    path = tmp_path / "t.ask"
    path.write_text(SPEC.format(capacity=capacity))
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True,
                                       set=[f"eviction={eviction}"]))
    assert rc == 0
    con = open_store(run_dir)
    replayed = {g: [json.loads(p)["item"]["q"] for (p,) in con.execute(
        "select params from sessions where game = ? order by index", [g]).fetchall()] for g in ("first", "second")}
    ev = con.execute("select item, reason, score from buffer_events where event = 'evict' order by seq").fetchall()
    held = [json.loads(v)["q"] for (v,) in con.execute("select value from buffer_items order by item").fetchall()]
    return replayed, ev, held, con


@pytest.mark.parametrize("eviction,first,second,evictions,held", [
    # the always-\\boxed{1} model solves the odd items (answer "1") and never the even ones
    ("oldest", [2, 3, 4], [2, 3, 4], [(0, "capacity", None)], [2, 3, 4]),
    ("none", [1, 2, 3], [1, 2, 3], [], [1, 2, 3]),
    ("solved", [1, 2, 3, 4], [2, 4], [(0, "solved", 1.0), (2, "solved", 1.0)], [2, 4]),
    ("no_peak", [1, 2, 3, 4], [1, 2, 3, 4], [(0, "no_peak", 1.0), (1, "no_peak", 0.0), (2, "no_peak", 1.0),
                                             (3, "no_peak", 0.0)], []),
    ("solved_or_no_peak", [1, 2, 3, 4], [2, 4], [(0, "solved", 1.0), (2, "solved", 1.0), (1, "no_peak", 0.0),
                                                 (3, "no_peak", 0.0)], []),
])
def test_each_eviction_mode_on_scripted_replays(tmp_path, eviction, first, second, evictions, held):
    capacity = 3 if eviction in ("oldest", "none") else 10
    replayed, ev, now, con = play(tmp_path, eviction, capacity)
    assert replayed == {"first": first, "second": second}
    assert ev == evictions and now == held
    # one replay event per replayed item and phase, with the game's score
    n = con.execute("select count(*) from buffer_events where event = 'replay' and score is not null").fetchone()[0]
    assert n == len(set(first)) + len(set(second))
    if eviction == "none":
        assert con.execute("select item, reason from buffer_events where event = 'rejected'").fetchall() == [(3, "full")]


def test_buffer_views_are_queryable_with_askspec_query(tmp_path):
    _, _, _, con = play(tmp_path, "solved")
    run_dir = con.execute("select run_dir from runs").fetchone()[0]
    import subprocess

    out = subprocess.run([sys.executable, "-m", "askspec.cli", "query", run_dir,
                          "select buffer, item, reason from buffer_events where event = 'evict' order by item"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "solved" in out.stdout and "kept" in out.stdout


def test_a_run_from_before_buffer_events_opens_without_a_warning(tmp_path):
    _, _, _, con = play(tmp_path, "oldest", capacity=3)
    run_dir = Path(con.execute("select run_dir from runs").fetchone()[0])
    con.close()
    for p in (run_dir / "events").glob("buffer_events.*"):
        p.unlink()
    from askspec.runtime.store.views import connect

    store = connect(run_dir)
    assert store.warnings == []
    assert store.con.execute("select count(*) from buffer_items").fetchone() == (0,)
