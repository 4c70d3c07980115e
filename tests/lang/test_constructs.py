"""Checks of individual constructs (the language extensions in particular): what they
lower to, and the diagnostics their misuse gets."""

from __future__ import annotations

from askspec.ir import model as ir
from askspec.ir.canonical import canonical_json, experiment_hash
from askspec.lang.compiler import compile_source

HEAD = '''
model m = hf("smollm2-135m-instruct")
role p { model = m; trained; memory = none; prompt = "Write a problem."; reply = tags("question", "answer", boxed = "answer") }
role s { model = m; trained; memory = none; reply = boxed }
'''


def compile_text(body: str, head: str = HEAD):
    return compile_source("t.ask", head + body)


def codes(res) -> list[str]:
    """Error codes in source order (the shared HEAD leaves unused-role warnings)."""
    return [d.code for d in res.sink.sorted() if d.is_error]


def steps(game: ir.Game, kind: str) -> list:
    out = []

    def walk(ss):
        for x in ss:
            if x.kind == kind:
                out.append(x)
            for attr in ("body", "orelse"):
                walk(getattr(x, attr, []) or [])
            for b in getattr(x, "branches", []) or []:
                walk(b.body)

    walk(game.body)
    return out


def test_tags_reply_and_drop_and_per_turn_rewards() -> None:
    res = compile_text('''
game g {
    qas = sample 3 ask p
    for qa in qas {
        if qa.parsed {
            sols = sample 4 ask s: qa.question
            acc = count(sols where equiv(answer, qa.answer)) / 4
            reward qa = 1 - acc
            if acc == 1 {
                drop sols
            } else {
                for x in sols { reward x = case { equiv(x.answer, qa.answer) -> 1; else -> 0 } }
            }
        } else {
            drop qa
        }
    }
}''')
    assert res.ok, [d.message for d in res.sink.items]
    p = res.ir.role("p")
    assert p.reply.kind == "tags" and p.reply.fields == ["question", "answer"]
    assert p.reply.args == {"tags": ["question", "answer"], "boxed": "answer"}
    g = res.ir.games[0]
    assert {(d.role, d.turn_var) for d in steps(g, "drop")} == {("s", "sols"), ("p", "qa")}
    assert {(r.role, r.turn_var) for r in steps(g, "reward")} == {("p", "qa"), ("s", "x")}
    assert g.call_bounds == {"p": 3, "s": 12}


def test_reward_coverage_is_per_path() -> None:
    # s is only asked on one branch; it is rewarded there: no E402
    ok = compile_text('''
game g {
    q = ask p
    if q.parsed {
        a = ask s: q.question
        reward s = 1
    }
    reward p = 1
}''')
    assert ok.ok, [d.message for d in ok.sink.items]
    missing = compile_text('''
game g {
    q = ask p
    if q.parsed {
        a = ask s: q.question
    }
    reward p = 1
}''')
    assert codes(missing) == ["E402"]
    assert "'s'" in missing.sink.items[0].message


def test_resample_recovery() -> None:
    res = compile_text('''
role t { model = m; trained; prompt = "Go."; reply = tags("q", "a", boxed = "a"); recover = resample; retries = 3 }
game g { x = ask t; reward t = 1 }''')
    assert res.ok
    t = res.ir.role("t")
    assert (t.recover.mode, t.recover.retries, t.recover.malformed) == ("resample", 3, None)
    assert res.ir.games[0].call_bounds["t"] == 4
    bad = compile_text('''
role t { model = m; prompt = "Go."; recover = resample; recover_malformed = "again" }
game g { ask t }''')
    assert codes(bad) == ["E107"]


def test_buffers_push_replay_and_score() -> None:
    res = compile_text('''
buffer qs { capacity = 10; eviction = solved_or_no_peak; patience = 3; score = acc; fields = {question: string, answer: string} }
game fill {
    x = ask p
    push qs: {question: x.question, answer: x.answer}
    reward p = 1
}
game replay for q in qs {
    a = sample 2 ask s: q.question
    acc = count(a where equiv(answer, q.answer)) / 2
    for y in a { reward y = 1 }
}
schedule alternating { p = 10; s = 5; games = {p: fill, s: [replay]} }''')
    assert res.ok, [d.message for d in res.sink.items]
    b = res.ir.buffers[0]
    assert (b.capacity, b.eviction, b.score, b.options) == (10, "solved_or_no_peak", "acc", {"patience": 3})
    assert res.ir.games[1].iter.scope == "buffer"
    assert res.ir.schedule.options["games"] == {"p": ["fill"], "s": ["replay"]}
    bad = compile_text('''
buffer qs { capacity = 10; fields = {question: string} }
game fill { x = ask p; push qs: {question: 1, extra: x.text}; push nope: {question: "a"}; reward p = 1 }''')
    assert codes(bad) == ["E201", "E202", "E110"]


def test_buffer_score_must_exist_in_replaying_game() -> None:
    res = compile_text('''
buffer qs { capacity = 10; eviction = solved; score = acc }
game fill { x = ask p; push qs: {question: x.question}; reward p = 1 }
game replay for q in qs { a = ask s: q.question; reward s = 1 }''')
    assert codes(res) == ["E101"]


def test_metric_where_filters_sessions() -> None:
    res = compile_text('''
game g {
    outcomes ok, skipped
    x = ask p
    good = x.parsed
    reward p = 1
}
metric rate = mean(good where outcome != skipped)''')
    assert res.ok
    assert res.ir.metrics[0].value.kind == "call" and res.ir.metrics[0].value.args[0].kind == "where"


def test_data_sets_are_in_game_scope() -> None:
    res = compile_text('''
data items = [{question: "1 + 1", answer: "2"}]
game g for item in items {
    a = ask s: item.question
    reward s = case { equiv(a.answer, item.answer) -> 1; else -> 0 }
}''')
    assert res.ok
    assert res.ir.games[0].iter.scope == "data"
    bad = compile_text('''
data items = [{question: "1 + 1"}]
game g for item in items { a = ask s: item.answer; reward s = 1 }''')
    assert codes(bad) == ["E202"]


def test_int_params_and_overrides() -> None:
    head = HEAD + "experiment e { param k: int = 2 }\n"
    body = "game g { repeat k { a = ask s: \"q\" }\n reward s = 1 }"
    assert compile_source("t.ask", head + body, {"k": "3"}).ir.games[0].call_bounds == {"s": 3}
    assert codes(compile_source("t.ask", head + body, {"k": "2.5"})) == ["E111"]
    assert codes(compile_source("t.ask", head.replace("= 2", "= 2.5") + body)) == ["E201"]


def test_unknown_experiment_setting() -> None:
    res = compile_text("experiment e { sed = 1 }\ngame g { a = ask s: \"q\"; reward s = 1 }")
    assert codes(res) == ["E105"] and "did you mean 'seed'" in res.sink.sorted()[-1].hint


def test_cascades_are_suppressed() -> None:
    # a missing template file is reported once, not again as "nothing to send"
    res = compile_text('role q { model = m; prompt = file("nope.j2") }\ngame g { ask q }')
    assert codes(res) == ["E303"]
    # an unknown model is reported once, not again as "no model here"
    res = compile_text('role q { model = mm; prompt = "x" }\ngame g { ask q }')
    assert codes(res) == ["E103"]
    # a bad --set keeps the default: one diagnostic
    res = compile_source("t.ask", "experiment e { param k: int = 2 }\n" + HEAD + 'game g { repeat k { a = ask s: "q" }\n reward s = 1 }',
                         {"k": "x"})
    assert codes(res) == ["E111"]


def test_for_over_a_data_set_with_a_limit_is_bounded(tmp_path):
    from askspec.lang.compiler import compile_source

    data = tmp_path / "d.jsonl"
    data.write_text('{"q": 1}\n{"q": 2}\n')
    src = """
model m = hf("x")
role a { model = m; prompt = "{{ r.q }}" }
data rows = jsonl("d.jsonl") { limit = 2 }
data open_rows = jsonl("d.jsonl")
game g {
    for r in rows { ask a }
    for r in open_rows limit 3 { ask a }
}
"""
    res = compile_source(str(tmp_path / "t.ask"), src)
    assert res.ok, [d.message for d in res.sink.items]
    assert res.ir.games[0].call_bounds["a"] == 5
    bad = compile_source(str(tmp_path / "t.ask"), src.replace("open_rows limit 3", "open_rows"))
    assert any(d.code == "E401" for d in bad.sink.items)


def test_ask_sampling_lowers_typed_fields_onto_that_ask_only():
    res = compile_text('''
param budget: int = 10000
game g {
    a = ask s: "1 + 1"
    b = ask s: "2 + 2" with sampling { max_tokens = budget; temperature = 0; stop = "END" }
    reward s = 1
}
''')
    assert codes(res) == []
    first, second = steps(res.ir.games[0], "ask")
    assert first.sampling == {}
    assert second.sampling == {"max_tokens": 10000, "temperature": 0, "stop": ["END"]}
    assert isinstance(second.sampling["max_tokens"], int)


def test_ask_sampling_per_role_lowers_over_the_shared_fields_and_into_the_hash():
    src = '''
param long: int = 8192
game g {
    a, b = ask s, t: "1 + 1" with sampling { max_tokens = 100; temperature = 0.5; t { max_tokens = long; stop = "END" } }
    c = ask s: "2 + 2" with sampling { max_tokens = 100 }
    reward s = 1
}
'''
    head = HEAD + 'role t { model = m; prompt = "go" }\n'
    res = compile_text(src, head)
    assert codes(res) == []
    both, one = steps(res.ir.games[0], "ask")
    assert both.sampling == {"max_tokens": 100, "temperature": 0.5}
    assert both.role_sampling == {"t": {"max_tokens": 8192, "stop": ["END"]}}
    assert both.sampling_for("s") == {"max_tokens": 100, "temperature": 0.5}
    assert both.sampling_for("t") == {"max_tokens": 8192, "temperature": 0.5, "stop": ["END"]}
    assert one.role_sampling is None
    # the role's own budget is part of the experiment: another value, another hash
    other = compile_text(src.replace("param long: int = 8192", "param long: int = 4096"), head)
    assert experiment_hash(other.ir) != experiment_hash(res.ir)
    # a spec without role sections hashes as before they existed
    assert "role_sampling" in canonical_json(res.ir)
    plain = compile_text(src.replace('; t { max_tokens = long; stop = "END" }', ""), head)
    assert codes(plain) == [] and "role_sampling" not in canonical_json(plain.ir)


def test_ask_sampling_set_twice_or_not_constant():
    res = compile_text('''
game g {
    a = ask s: "1 + 1"
    b = ask s: "2 + 2" with sampling { max_tokens = 10; max_tokens = 20 }
    c = ask s: "3 + 3" with sampling { max_tokens = a.tokens }
    reward s = 1
}
''')
    assert codes(res) == ["E104", "E107"]  # a per-ask budget is known before the run, like a role's
