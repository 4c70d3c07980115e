"""What `max_prompt_tokens` / `prompt_overflow` and `memory = shared(NAME)` lower to, and
that a spec using neither hashes as before they existed (their unset fields are left out
of the canonical JSON)."""

from __future__ import annotations

from askspec.ir import canonical
from askspec.ir import model as ir
from askspec.lang.compiler import compile_source

SPEC = '''
model m = hf("smollm2-135m-instruct")
role a {{ model = m; memory = {memory}; prompt = "Go."{cap} }}
role b {{ model = m; memory = {memory}; prompt = "Go." }}
game g {{
    outcomes done, too_long
    ask a
    ask b
    end done
}}
'''


def compiled(memory: str = "full", cap: str = "") -> ir.Experiment:
    res = compile_source("t.ask", SPEC.format(memory=memory, cap=cap))
    assert res.ok and res.ir is not None, [d.message for d in res.sink.sorted()]
    return res.ir


def test_the_settings_lower_to_the_role() -> None:
    a = compiled(cap="; max_prompt_tokens = 1280; prompt_overflow = truncate_left").role("a")
    assert (a.max_prompt_tokens, a.prompt_overflow) == (1280, ir.PromptOverflow(mode="truncate_left"))
    a = compiled(cap="; max_prompt_tokens = 2048; prompt_overflow = end(too_long)").role("a")
    assert a.prompt_overflow == ir.PromptOverflow(mode="end", outcome="too_long")
    shared = compiled(memory="shared(debate)")
    assert [r.memory for r in shared.roles] == [ir.Memory(kind="shared", conversation="debate")] * 2


def test_unset_fields_stay_out_of_the_hash() -> None:
    plain = compiled()
    data = canonical.canonical_json(plain)
    assert "max_prompt_tokens" not in data and "prompt_overflow" not in data and "conversation" not in data
    # the same spec's hash before the fields existed: the IR dumped without them
    old = plain.model_dump(mode="json", exclude={"roles": {i: {"max_prompt_tokens", "prompt_overflow"}
                                                          for i in range(len(plain.roles))}})
    for r in old["roles"]:
        del r["memory"]["conversation"]
    assert canonical.canonical_data(plain) == canonical._strip_spans(old)
    capped = compiled(cap="; max_prompt_tokens = 2048; prompt_overflow = end(too_long)")
    assert canonical.experiment_hash(capped) != canonical.experiment_hash(plain)
    assert canonical.experiment_hash(compiled(memory="shared(x)")) != canonical.experiment_hash(plain)


def test_fmt_writes_end_of_an_overflow_as_a_call() -> None:
    from askspec.lang.fmt import format_source

    text = 'role q { max_prompt_tokens = 512; prompt_overflow = end(too_long) }\n'
    assert format_source(text) == text
    assert format_source(text.replace("end(", "end (")) == text
