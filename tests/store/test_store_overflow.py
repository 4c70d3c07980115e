"""One huge event keeps every view readable (issue #8 item 5): long strings go to
events/overflow/ side files, and the views read long lines written by older versions."""

from __future__ import annotations

import json

from askspec.runtime.store import layout
from askspec.runtime.store.compact import compact_run
from askspec.runtime.store.overflow import LINE_CHARS, read_overflow
from askspec.runtime.store.views import connect

HUGE = 20 << 20  # a server that ignored max_tokens


def test_a_20mb_reply_is_stored_aside_and_the_run_stays_queryable(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    a = w.session_started("big", game="g", group_id=None, params={}, index=9)
    reply = "".join(chr(0x61 + i % 26) for i in range(26)) * (HUGE // 26) + "ünïcode end"
    w.turn("big", a, turn_index=0, role="questioner", model="m", prompt=[{"role": "user", "content": "go"}],
           text=reply, parsed={"answer": reply, "ok": True}, finish_reason="length", tokens_in=1,
           tokens_out=9, latency_ms=2.0)
    # The huge reply is in the next prompt, too (memory = full).
    w.turn("big", a, turn_index=1, role="questioner", model="m",
           prompt=[{"role": "user", "content": "go"}, {"role": "assistant", "content": reply},
                   {"role": "user", "content": "shorter please"}],
           text="ok", parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
    w.session_finished("big", a, status="ok", outcome=None, error=None, vars={"last": reply})
    w.finish()

    for name in layout.EVENT_NAMES:
        for line in layout.ndjson_path(w.run_dir, name).read_bytes().splitlines():
            assert len(line) <= 4 * LINE_CHARS
    side = list((w.run_dir / "events" / "overflow").iterdir())
    assert len(side) == 1  # one file per distinct string, however often it appears
    con = connect(w.run_dir).con
    rows = con.execute("SELECT turn_index, length(text), overflow FROM turns WHERE session_id = 'big' "
                       "ORDER BY 1").fetchall()
    assert rows[0][1] == 256 and rows[1][1] == 2
    first = json.loads(rows[0][2])
    assert [r["path"] for r in first] == ["$.text", "$.parsed.answer"]
    assert all(r["chars"] == len(reply) for r in first)
    assert read_overflow(w.run_dir, first[0]) == reply
    assert [r["path"] for r in json.loads(rows[1][2])] == ["$.prompt[0].content"]  # the delta's message
    (prompt,) = con.execute("SELECT prompt FROM turns WHERE session_id = 'big' AND turn_index = 1").fetchone()
    assert [len(m["content"]) for m in json.loads(prompt)] == [2, 256, 14]
    (overflow,) = con.execute("SELECT overflow FROM sessions WHERE session_id = 'big'").fetchone()
    assert json.loads(overflow)[0]["path"] == "$.vars.last"
    assert con.execute("SELECT count(*) FROM turns").fetchone() == (4,)
    compact_run(w.run_dir)
    con = connect(w.run_dir).con
    assert con.execute("SELECT sum(length(text)) FROM turns").fetchone()[0] < 1000


def test_many_long_fields_shrink_until_the_line_fits(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    a = w.session_started("s", game="g", group_id=None, params={}, index=0)
    messages = [{"role": "user", "content": f"{i} " + "x" * 40_000} for i in range(60)]  # 2.4M chars
    w.turn("s", a, turn_index=0, role="r", model=None, prompt=messages, text="t", parsed=None,
           finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    w.finish()
    (line,) = layout.ndjson_path(w.run_dir, "turns").read_bytes().splitlines()
    assert len(line) <= LINE_CHARS
    ev = json.loads(line)
    assert len(ev["overflow"]) == 60
    for rec in ev["overflow"]:
        i = int(rec["path"].split("[")[1].split("]")[0])
        assert read_overflow(w.run_dir, rec) == messages[i]["content"]


def test_views_read_long_lines_from_older_writers(finished_run):
    """A 40 MB line (text and parsed both 20 MB) exceeded DuckDB's default object size."""
    path = layout.ndjson_path(finished_run, "turns")
    ev = json.loads(path.read_bytes().splitlines()[0])
    ev.update(seq=1000, text="y" * HUGE, parsed={"a": "z" * HUGE})
    with open(path, "a") as f:
        f.write(json.dumps(ev) + "\n")
    con = connect(finished_run).con
    assert con.execute("SELECT count(*), max(length(text)) FROM events_turns").fetchone() == (9, HUGE)
    compact_run(finished_run)
    assert connect(finished_run).con.execute("SELECT count(*) FROM events_turns").fetchone() == (9,)


def test_a_confined_query_can_read_the_full_text(kit, tmp_path):
    from askspec.runtime.store.readonly import open_readonly_store, run_readonly

    w = kit.new_writer(tmp_path, flush_interval=0)
    a = w.session_started("s", game="g", group_id=None, params={}, index=0)
    w.turn("s", a, turn_index=0, role="r", model=None, prompt=[], text="z" * (2 << 20), parsed=None,
           finish_reason=None, tokens_in=None, tokens_out=None, latency_ms=None)
    w.finish()
    store = open_readonly_store(w.run_dir)
    table = run_readonly(store.con, "SELECT overflow->0->>'file' AS f FROM turns").table
    rel = table.to_pylist()[0]["f"]
    table = run_readonly(store.con, f"SELECT length(content) AS n FROM read_text('{w.run_dir}/events/{rel}')").table
    assert table.to_pylist() == [{"n": 2 << 20}]
