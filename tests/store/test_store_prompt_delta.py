"""Each turn stores its prompt as the delta from the role's previous prompt in the session
(issue #14 item 4); the turns view gives the full prompt back."""

from __future__ import annotations

import json

from askspec.runtime.store import layout
from askspec.runtime.store.compact import compact_run
from askspec.runtime.store.views import connect
from askspec.runtime.store.writer import RunWriter


def stored(run_dir):
    return [json.loads(line) for line in layout.ndjson_path(run_dir, "turns").read_text().splitlines()]


def prompts(run_dir, session="s0"):
    con = connect(run_dir).con
    return [(role, None if p is None else json.loads(p)) for role, p in con.execute(
        "SELECT role, prompt FROM turns WHERE session_id = ? ORDER BY turn_index", [session]).fetchall()]


def play_conversation(w, sid="s0", turns=6, attempt=None):
    """Two roles: 'a' with full memory (each prompt extends its last), 'b' with a window
    of one exchange (each prompt drops old messages). Returns the prompts sent, in order."""
    attempt = attempt or w.session_started(sid, game="g", group_id=None, params={}, index=0)
    sent = []
    hist = {"a": [], "b": []}
    system = {"a": "You are A.", "b": "You are B."}
    for t in range(turns):
        role = "ab"[t % 2]
        user = {"role": "user", "content": f"turn {t} for {role}"}
        # A fresh system dict each call, as the engine builds it: equal, not identical.
        messages = [{"role": "system", "content": system[role]}] + hist[role] + [user]
        reply = f"reply {t}"
        w.turn(sid, attempt, turn_index=t, role=role, model="m", prompt=messages, text=reply, parsed={},
               finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
        sent.append((role, messages))
        hist[role] = hist[role] + [user, {"role": "assistant", "content": reply}]
        if role == "b":
            hist[role] = hist[role][-2:]
    return attempt, sent


def test_full_memory_prompts_are_stored_as_deltas_and_rebuilt(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    attempt, sent = play_conversation(w)
    w.session_finished("s0", attempt, status="ok", outcome=None, error=None, vars={})
    w.finish()
    lines = stored(w.run_dir)
    a_lines = [ev for ev in lines if ev["role"] == "a"]
    assert "prompt_chain" not in a_lines[0] and len(a_lines[0]["prompt"]) == 2
    assert [(ev["prompt_chain"], ev["prompt_link"], len(ev["prompt"])) for ev in a_lines[1:]] == [(0, 1, 2), (0, 2, 2)]
    assert a_lines[2]["prompt"] == [{"role": "assistant", "content": "reply 2"}, {"role": "user", "content": "turn 4 for a"}]
    # The window role's third prompt has dropped old messages: it is stored whole.
    b_lines = [ev for ev in lines if ev["role"] == "b"]
    assert [ev.get("prompt_link") for ev in b_lines] == [None, 1, None]
    assert prompts(w.run_dir) == sent
    compact_run(w.run_dir)
    assert prompts(w.run_dir) == sent


def test_delta_chains_are_per_attempt_and_a_missing_link_gives_null(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    play_conversation(w)
    w.close()  # dies before the session ends
    w = RunWriter.open_for_resume(w.run_dir, flush_interval=0)
    attempt, sent = play_conversation(w, turns=4)
    assert attempt == 2
    w.session_finished("s0", attempt, status="ok", outcome=None, error=None, vars={})
    w.finish()
    retry = [ev for ev in stored(w.run_dir) if ev["attempt"] == 2]
    assert "prompt_chain" not in retry[0]  # a new attempt starts its own chain
    assert prompts(w.run_dir) == sent

    # A chain whose middle line is lost rebuilds nothing wrong: the later prompts are NULL.
    path = layout.ndjson_path(w.run_dir, "turns")
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if not ('"attempt":2' in line and '"turn_index":2,' in line)]
    path.write_text("".join(kept))
    got = dict((t, p) for t, (_, p) in enumerate(prompts(w.run_dir)))
    assert got[0] == sent[0][1] and got[1] == sent[1][1]
    assert [p for _, p in prompts(w.run_dir)][2:] == [sent[3][1]]  # turn 3 (role b) is in another chain


def test_legacy_full_prompts_and_non_list_prompts_read_as_they_are(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    a = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    w.turn("s0", a, turn_index=0, role="a", model=None, prompt="plain text prompt", text="x", parsed=None,
           finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    w.turn("s0", a, turn_index=1, role="a", model=None, prompt=None, text="y", parsed=None,
           finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    w.finish()
    with open(layout.ndjson_path(w.run_dir, "turns"), "a") as f:  # a format-1 line: the whole prompt
        f.write(json.dumps({"seq": 3, "ts": "2026-01-01T00:00:00.000000Z", "run_id": w.run_id, "gen": 0,
                            "session_id": "s0", "attempt": 1, "turn_index": 2, "role": "a",
                            "prompt": [{"role": "user", "content": "old"}], "text": "z"}) + "\n")
    assert prompts(w.run_dir) == [("a", "plain text prompt"), ("a", None), ("a", [{"role": "user", "content": "old"}])]


def test_an_engine_reusing_its_list_does_not_fool_the_delta(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    a = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    messages = [{"role": "user", "content": "one"}]
    w.turn("s0", a, turn_index=0, role="a", model=None, prompt=messages, text="r", parsed=None,
           finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    messages[0] = {"role": "user", "content": "changed"}  # mutated in place after recording
    messages.append({"role": "user", "content": "two"})
    w.turn("s0", a, turn_index=1, role="a", model=None, prompt=messages, text="r", parsed=None,
           finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    w.finish()
    assert prompts(w.run_dir) == [("a", [{"role": "user", "content": "one"}]),
                                  ("a", [{"role": "user", "content": "changed"}, {"role": "user", "content": "two"}])]


def test_delta_lines_stay_small_as_the_conversation_grows(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    a = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    history = [{"role": "system", "content": "s" * 2000}]
    for t in range(40):
        history = history + [{"role": "user", "content": f"question {t} " + "q" * 200}]
        w.turn("s0", a, turn_index=t, role="a", model=None, prompt=history, text="a" * 200, parsed=None,
               finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
        history = history + [{"role": "assistant", "content": "a" * 200}]
    w.finish()
    sizes = [len(line) for line in layout.ndjson_path(w.run_dir, "turns").read_bytes().splitlines()]
    assert max(sizes[1:]) < 1000 < sizes[0]  # whole prompts would reach ~20 KB per line
    (total,) = connect(w.run_dir).con.execute(
        "SELECT sum(json_array_length(prompt)) FROM turns").fetchone()
    assert total == sum(2 + 2 * t for t in range(40))
