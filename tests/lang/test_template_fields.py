"""Templates' field access is checked against what the protocol declares (E202 at the
template's own file:line:col, with a "did you mean"), and at run time a template error
names an inline template by its place in the spec, not by its content hash."""

from __future__ import annotations

import asyncio
import json

import pytest

from askspec.lang.compiler import compile_source

HEAD = """model m = hf("smollm2-135m-instruct")
data claims = [{claim: "the sky is blue", truth: true}]
role oracle { model = m; reply = json({truth: bool}) }
"""


def e202(body: str) -> list[tuple[int, int, str, str | None]]:
    res = compile_source("t.ask", HEAD + body)
    return [(d.span.line, d.span.col, d.message, d.hint) for d in res.sink.sorted() if d.code == "E202" and d.span]


def game(*stmts: str) -> str:
    return "game verify for item in claims {\n" + "".join(f"    {s}\n" for s in stmts) + "}\n"


@pytest.mark.parametrize("template, message, col", [
    ("{{ item.claimm }}", "no field 'claimm' in {claim: string, truth: bool}", 42),
    ("{{ item['claimm'] }}", "no field 'claimm' in {claim: string, truth: bool}", 43),
])
def test_a_data_field_typo_in_an_inline_template(template, message, col):
    [(line, c, msg, hint)] = e202(game(f'r = ask oracle using "Claim: {template}"'))
    assert (line, c) == (5, col) and message in msg and hint == "did you mean 'claim'?"


def test_reply_fields_and_session_variables():
    got = e202(game('r = ask oracle using "{{ item.claim }}"', 'n = 3',
                    'ask oracle using "{{ r.truht }} {{ r.text }} {{ n.x }} {{ item.claim.upper() }}"'))
    assert [(line, msg) for line, _, msg, _ in got] == [
        (7, "a reply of 'oracle' has no field 'truht'"), (7, "a number value has no fields")]
    assert got[0][3] == "did you mean 'truth'?"


@pytest.mark.parametrize("template", [
    "{% for item in [{'x': 1}] %}{{ item.x }}{% endfor %}",  # a template-local name shadows the game's
    "{% set r = {'y': 2} %}{{ r.y }}",
    "{{ item.items() | list }} {{ item.get('claim') }} {{ item.keys() | list }}",  # a record's own methods
    "{{ r.text.strip() }} {{ r.parsed }} {{ r.truncated }}",
    "{% if item.note is defined %}{{ item.note }}{% endif %}{{ item.source | default('') }}",  # guarded reads
])
def test_what_renders_is_not_reported(template):
    assert e202(game('r = ask oracle using "{{ item.claim }}"', f"ask oracle using {json.dumps(template)}")) == []


def test_open_records_are_not_checked(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"claim": "x"}\n')
    spec = tmp_path / "t.ask"
    text = HEAD.replace('[{claim: "the sky is blue", truth: true}]', 'jsonl("c.jsonl")') + game(
        'ask oracle using "{{ item.anything }}"')
    res = compile_source(str(spec), text)
    assert res.ok, [d.message for d in res.sink.items]


# ---------------------------------------------------------------- run time

RUN_SPEC = """model m = python("fields_model:echo")
data claims = jsonl("claims.jsonl")
role q { model = m }
game g for item in claims {
    ask q using "Claim: {{ item.claimm }}"
}
"""


def test_a_run_time_template_error_names_the_inline_template_by_file_line_col(tmp_path, monkeypatch):
    (tmp_path / "fields_model.py").write_text("def echo(messages, request):\n    return 'ok'\n")
    (tmp_path / "claims.jsonl").write_text('{"claim": "the sky is blue"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from askspec.runtime.commands.run import run_spec
    from askspec.runtime.store.views import open_store

    (tmp_path / "t.ask").write_text(RUN_SPEC)
    assert compile_source("t.ask", RUN_SPEC).ok  # open records: nothing certain at check time
    rc, run_dir = asyncio.run(run_spec("t.ask", out="runs"))
    [(status, error)] = open_store(run_dir).execute("SELECT status, error FROM sessions").fetchall()
    assert status == "error"
    assert error.startswith("inline template at t.ask:5:17: "), error
    assert "has no attribute 'claimm'" in error and "inline:" not in error
