"""Definite assignment (E409): a variable read by a step, a reward, a template or a metric
must have a value on every path that reaches the read; the error names the path that
leaves it unassigned (issue 30 item 8)."""

from __future__ import annotations

import pytest

from askspec.lang.compiler import compile_source

HEAD = '''
model m = hf("smollm2-135m-instruct")
role q { model = m; trained; prompt = "Ask a question."; reply = sections("#Question#") }
role s { model = m; prompt = "Answer." }
'''


def e409(body: str, head: str = HEAD) -> list[str]:
    res = compile_source("t.ask", head + body)
    other = [d for d in res.sink.sorted() if d.is_error and d.code != "E409"]
    assert not other, [f"{d.code} {d.message}" for d in other]
    return [f"{d.span.line}:{d.span.col} {d.message}" for d in res.sink.sorted() if d.code == "E409"]


def test_reward_reads_a_variable_assigned_only_in_an_if() -> None:
    got = e409('''
game g {
    r = ask q
    if r.parsed {
        a = 1
    }
    reward q = a
}''')
    assert got == ["11:16 'a' may have no value here: it is unassigned when the `if` at 8:5 is false"]


@pytest.mark.parametrize("body", [
    # if/else both assigning
    '''
game g {
    r = ask q
    if r.parsed { a = 1 } else { a = 0 }
    reward q = a
}''',
    # if/elif/else, every branch assigning (one by an ask)
    '''
game g {
    r = ask q
    if r.parsed { a = 1 } elif r.truncated { a = ask s } else { a = 0 }
    reward q = 1
    x = a
}''',
    # a branch that ends the session need not assign
    '''
game g {
    outcomes ok, bad
    r = ask q
    if not r.parsed { reward q = 0; end bad } else { a = 1 }
    reward q = a
}''',
    # assigned before the if, reassigned in it
    '''
game g {
    a = 0
    r = ask q
    if r.parsed { a = 1 }
    reward q = a
}''',
    # read inside the branch that assigns it
    '''
game g {
    r = ask q
    if r.parsed { a = 1; reward q = a } else { reward q = 0 }
}''',
    # a loop that certainly runs: repeat with a constant count, for over a constant list
    '''
game g {
    r = ask q
    repeat 2 { n = 1 }
    for x in [1, 2] { seen = x }
    reward q = n + seen
}''',
    # a condition on parameters only is decided at compile time (both ifs agree)
    '''
param variant = "a"
game g {
    r = ask q
    if variant == "a" { a = 1 }
    if variant == "a" { reward q = a } else { reward q = 0 }
}''',
    # a metric over a variable of the game that sets it on every path that reaches the end;
    # a session ended early gives the metric nothing
    '''
game g {
    outcomes ok, bad
    r = ask q
    if not r.parsed { reward q = 0; end bad }
    good = true
    reward q = 1
}
metric good_rate = mean(good)''',
    # a template guarding its read of a maybe-unassigned variable
    '''
game g {
    r = ask q
    if r.parsed { question = r.question; extra = 1 }
    ask s using "{% if question is defined %}{{ question }}{% endif %} {{ extra | default('') }}"
    reward q = 1
}''',
])
def test_clean(body: str) -> None:
    assert e409(body) == []


def test_later_step_template_and_metric() -> None:
    got = e409('''
game g {
    outcomes ok, malformed
    r = ask q
    if r.parsed {
        question = r.question
        good = true
    } elif r.truncated {
        reward q = 0
        end malformed
    } else {
        good = false
    }
    ask s using "Answer {{ question }}."
    x = question
    reward q = 1
}
metric good_rate = mean(good)
metric asked = mean(question == "")''')
    assert got == [
        "18:28 'question' may have no value here: it is unassigned when the `if` at 9:5 takes its `else`",
        "19:9 'question' may have no value here: it is unassigned when the `if` at 9:5 takes its `else`",
        "23:21 metric 'asked' reads 'question', which game 'g' leaves unassigned when the `if` at 9:5 takes its `else`",
    ]


def test_loops_that_may_not_run() -> None:
    got = e409('''
param items: list[number] = []
game g {
    r = ask q
    while not r.parsed limit 3 {
        r = ask q
        tries = 1
    }
    for x in items limit 2 {
        seen = x
    }
    reward q = tries + seen
}''')
    assert got == [
        "16:16 'tries' may have no value here: it is unassigned when the `while` at 9:5 runs no iteration",
        "16:24 'seen' may have no value here: it is unassigned when the `for` at 13:5 runs no iteration",
    ]


def test_nested_if_names_the_inner_path_and_outcome_reads() -> None:
    got = e409('''
game g {
    outcomes ok, bad
    r = ask q
    if r.parsed {
        if r.truncated { a = 1 } else { a = 2 }
        if r.truncated { b = 1 }
        outcome = ok
    }
    reward q = a + b
    done = outcome == ok
}''')
    assert got == [
        "14:16 'a' may have no value here: it is unassigned when the `if` at 9:5 is false",
        "14:20 'b' may have no value here: it is unassigned when the `if` at 11:9 is false",
        "15:12 'outcome' may have no value here: it is unassigned when the `if` at 9:5 is false",
    ]


def test_reward_target_and_unrelated_names() -> None:
    # a per-turn reward's reply variable is read too; loop and pattern names are always bound
    got = e409('''
data d = [{x: 1}]
game g for it in d {
    r = ask q
    if r.parsed { t = ask s }
    reward t = it.x
    reward q = 1
}''')
    assert got == ["10:12 't' may have no value here: it is unassigned when the `if` at 9:5 is false"]


def test_judge_prompt_reads_the_session_end_on_every_path() -> None:
    # a judge prompt renders once the session is over, however it ended: after an `end` too
    head = HEAD + '''
role judge { model = m; reply = boxed }
judge grade { judge = judge; prompt = "{{ note }} {{ response }} {{ kept | default('') }}" }
'''
    body = '''
game g sample 2 {
    outcomes ok, bad
    r = ask q
    kept = 1
    if not r.parsed {
        reward q = 0
        end bad
    }
    note = r.question
    reward q = 1
    route q { when var(rewards) > 0 -> keep; else -> judge grade }
}'''
    assert e409(body, head) == ["7:43 'note' may have no value here: it is unassigned when the session ends at 15:9"]
    # assigned before the `end`: clean
    assert e409(body.replace("    kept = 1\n", "    kept = 1\n    note = \"\"\n"), head) == []


def test_a_field_read_through_default_is_not_guarded() -> None:
    # `x.a | default(...)` still fails when x has no value: only `x is defined` / `x | default` guard x
    got = e409('''
game g {
    r = ask q
    if r.parsed { p = r }
    ask s using "{{ p.question | default('') }}"
    reward q = 1
}''')
    assert got == ["9:21 'p' may have no value here: it is unassigned when the `if` at 8:5 is false"]
