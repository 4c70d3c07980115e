"""Reply parsers: sections, boxed, summary, json, words, fallback answer, registry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from askspec.runtime.replies.parsers import (
    NO_SUMMARY_PLACEHOLDER,
    PARSERS,
    ParsedReply,
    fallback_answer,
    field_name,
    is_truncated,
    json_reply,
    last_boxed,
    parse,
    sections,
    summary,
    words,
)

ASK_E_TAGS = ["#Reasoning#", "#Draft#", "#Question#"]

# --------------------------------------------------------------------------- sections


def test_sections_basic_and_field_names():
    text = "#Reasoning#\nthink\n\n#Draft#\ndraft \\boxed{7}\n\n#Question#\nWhat is 3+4?\n"
    r = sections(text, ASK_E_TAGS)
    assert r.ok and r.missing == []
    assert r["reasoning"] == "think"
    assert r["draft"] == "draft \\boxed{7}"
    assert r["question"] == "What is 3+4?"
    assert r["text"] == text
    assert r["answer"] == "7"  # the draft's boxed solution


@pytest.mark.parametrize(
    "tag, name",
    [("#Question#", "question"), ("#Final Answer#", "finalanswer"), ("#Final_Answer#", "final_answer"),
     ("<Draft>", "draft"), ("#Q2#", "q2"), ("#_#", "")],
)
def test_field_name(tag, name):
    assert field_name(tag) == name


def test_sections_last_occurrence_wins():
    text = (
        "#Reasoning# I will write my #Question# later.\n"
        "#Draft# first try\n#Question# Old question?\n"
        "#Draft# second try\n#Question# New question?"
    )
    r = sections(text, ASK_E_TAGS)
    assert r["question"] == "New question?"
    assert r["draft"] == "second try"
    # the last #Reasoning# is the only one; its content stops at the next known tag
    assert r["reasoning"] == "I will write my"


def test_sections_content_stops_at_next_known_tag_even_if_out_of_order():
    r = sections("#Question# Q? #Reasoning# afterthought", ASK_E_TAGS)
    assert r["question"] == "Q?"
    assert r["reasoning"] == "afterthought"
    assert r["draft"] is None


@pytest.mark.parametrize(
    "text",
    [
        "**#Question#** What is 2+2?",
        "`#Question#` What is 2+2?",
        "## #Question#\nWhat is 2+2?",
        "#Question#: What is 2+2?",
    ],
)
def test_sections_markdown_decoration_is_not_content(text):
    assert sections(text, ASK_E_TAGS)["question"] == "What is 2+2?"


def test_sections_decoration_of_next_tag_not_in_previous_section():
    r = sections("#Draft# d \\boxed{1}\n**#Question#** q", ASK_E_TAGS)
    assert r["draft"] == "d \\boxed{1}"


@pytest.mark.parametrize(
    "text, missing",
    [
        ("#Reasoning# r #Draft# d", ["question"]),  # tag absent
        ("#Reasoning# r #Draft# d #Question#   \n", ["question"]),  # present but empty
        ("", ["question"]),
        ("#question# lower-case is not the tag", ["question"]),  # case-sensitive
    ],
)
def test_sections_required_default_is_last_tag(text, missing):
    r = sections(text, ASK_E_TAGS)
    assert not r.ok
    assert r.missing == missing
    assert "question" in r.reason


def test_sections_explicit_required_accepts_tags_or_names():
    r = sections("#Question# q", ASK_E_TAGS, required=["#Reasoning#", "question"])
    assert r.missing == ["reasoning"]
    assert sections("#Question# q", ASK_E_TAGS, required=[]).ok


def test_sections_empty_vs_absent():
    r = sections("#Draft#\n#Question# q", ASK_E_TAGS)
    assert r["draft"] == ""
    assert r["reasoning"] is None


def test_sections_answer_section_drives_answer():
    r = sections("#Work# \\boxed{1} #Answer# 42.", ["#Work#", "#Answer#"])
    assert r["answer"] == "42"


@pytest.mark.parametrize(
    "tags, required",
    [([], None), (["##"], None), (["#Text#"], None), (["#A#", "<a>"], None), (["#A#"], ["#B#"])],
)
def test_sections_bad_spec_args_raise_value_error(tags, required):
    with pytest.raises(ValueError):
        sections("x", tags, required)


# --------------------------------------------------------------------------- boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\left\\{ 1, \\{2\\} \\right\\}}", "\\left\\{ 1, \\{2\\} \\right\\}"),
        ("$\\boxed{x^{2^{3}}}$", "x^{2^{3}}"),
        ("\\boxed {  7 }", "7"),
        ("so \\boxed 5.", "5"),
        ("$\\boxed 12$", "12"),
        ("\\fbox{abc}", "abc"),
        ("\\boxed{3} and put it in \\boxed{}", "3"),  # empty box is an instruction echo
        ("\\boxed{1} ... \\boxed{2", None),  # last box cut off -> None, not the old one
        ("\\boxed{", None),
        ("\\boxed", None),
        ("no box here", None),
        ("\\boxeddot{3}", None),  # a different command
        ("\\boxed{a}}}", "a"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_boxed_linear_on_adversarial_input():
    text = "\\boxed{}" * 50_000 + "\\boxed{" * 50_000
    assert last_boxed(text) is None


# --------------------------------------------------------------------------- fallback


@pytest.mark.parametrize(
    "text, expected",
    [
        ("lots of work \\boxed{17} then words", "17"),
        ("The answer is 42.", "42"),
        ("The answer is -3.", "-3"),
        ("The answer is 0.5!", "0.5"),
        ("so x = 5 .", "5"),
        ("Final: **42**", "42"),
        ("answer: $x^2$.", "x^2"),
        ("the point is (1,2).", "(1,2)"),
        ("(the answer is 7)", "7"),
        ("I think it's \"blue\".", "blue"),
        ("result \\(12\\).", "12"),
        ("the set is ∅.", "∅"),
        ("ends with dashes 9 — — ...", "9"),
        ("!!! ... ???", None),
        ("", None),
        (None, None),
        ("cut off \\boxed{12", "\\boxed{12"),  # truncated: last word, marked wrong later
    ],
)
def test_fallback_answer(text, expected):
    assert fallback_answer(text) == expected


# --------------------------------------------------------------------------- words


@pytest.mark.parametrize(
    "text, n, expected",
    [
        ("one two three four", 2, "one two"),
        ("  one\ntwo  three ", 2, "one\ntwo"),  # inner layout preserved
        ("one two", 5, "one two"),
        ("one two", 0, ""),
        ("", 3, ""),
        (None, 3, ""),
    ],
)
def test_words(text, n, expected):
    assert words(text, n) == expected


def test_words_200_keeps_exactly_200():
    text = " ".join(f"w{i}" for i in range(500))
    out = words(text, 200)
    assert len(out.split()) == 200 and out.split()[-1] == "w199"


# --------------------------------------------------------------------------- summary

BOXED = "\\boxed{67}"


def test_summary_text_after_last_tag():
    text = "work #Summary# draft summary\nmore #Output# We reduced mod 100.\n\n" + BOXED
    r = summary(text)
    assert r["summary"] == "We reduced mod 100.\n\n" + BOXED  # box inside window: as is
    assert r["answer"] == "67"
    assert r.ok


def test_summary_cap_prepends_boxed_cut_off():
    body = "x" * 3000
    r = summary("#Summary# " + body + " " + BOXED)
    assert r["summary"] == BOXED + "\n\n" + "x" * 2000
    assert r["answer"] == "67"


def test_summary_boxed_above_tag_is_prepended():
    r = summary("work... $\\boxed{\\frac{1}{2}}$\n#Summary#\nHalved it.")
    assert r["summary"] == "\\boxed{\\frac{1}{2}}\n\nHalved it."


def test_summary_boxed_not_duplicated_when_inside_window():
    r = summary("#Summary# \\boxed{5} because 2+3.", max_chars=100)
    assert r["summary"] == "\\boxed{5} because 2+3."


def test_summary_final_box_kept_even_if_an_earlier_box_is_in_window():
    r = summary("#Summary# first \\boxed{1} " + "y" * 50 + " final \\boxed{2}", max_chars=30)
    assert r["summary"].startswith("\\boxed{2}\n\n")
    assert "\\boxed{1}" in r["summary"]


def test_summary_no_tag_forwards_boxed_only():
    r = summary("long chain of thought ... so \\boxed{12}. Done.")
    assert r["summary"] == "\\boxed{12}"
    assert not r.ok and r.missing == ["summary"]


def test_summary_neither_gives_placeholder():
    r = summary("I could not solve it")
    assert r["summary"] == NO_SUMMARY_PLACEHOLDER
    assert r.missing == ["summary", "answer"]
    assert r["answer"] == "it"  # the final-answer rule still applies


def test_summary_tag_with_empty_body():
    assert summary("\\boxed{3} #Summary#   ")["summary"] == "\\boxed{3}"
    assert summary("#Summary#")["summary"] == NO_SUMMARY_PLACEHOLDER


def test_summary_keep_boxed_false():
    r = summary("\\boxed{3} #Summary# because", keep_boxed=False)
    assert r["summary"] == "because"
    assert summary("\\boxed{3}", keep_boxed=False)["summary"] == NO_SUMMARY_PLACEHOLDER


def test_summary_custom_tags_and_no_cap():
    r = summary("a <S> " + "z" * 5000, after=["<S>"], max_chars=None)
    assert r["summary"] == "z" * 5000


# --------------------------------------------------------------------------- json

JUDGE = {
    "is_final_answer": "bool",
    "is_correct": "bool",
    "all_rubric_criteria_resolved": "bool",
    "missing_rubric_criteria": "list",
    "notes": "string?",
}
VERDICT = (
    '{"is_final_answer": true, "is_correct": false, "all_rubric_criteria_resolved": false,'
    ' "missing_rubric_criteria": ["budget"], "notes": "asks {again}"}'
)


@pytest.mark.parametrize(
    "text",
    [
        VERDICT,
        "Verdict:\n```json\n" + VERDICT + "\n```\nthanks",
        "```\n" + VERDICT + "\n```",
        "Here is my verdict " + VERDICT + " -- end.",
        # an example object that does not fit the schema, then the real one
        'Format: {"example": 1}\n' + VERDICT,
    ],
)
def test_json_valid(text):
    r = json_reply(text, JUDGE)
    assert r.ok, r.reason
    assert r["is_final_answer"] is True
    assert r["missing_rubric_criteria"] == ["budget"]
    assert r["notes"] == "asks {again}"  # braces inside strings do not confuse it
    assert r["object"]["is_correct"] is False


def test_json_fenced_preferred_over_loose():
    text = '{"is_final_answer": "nope"}\n```json\n' + VERDICT + "\n```"
    assert json_reply(text, JUDGE).ok


ALL_REQUIRED = ["is_final_answer", "is_correct", "all_rubric_criteria_resolved", "missing_rubric_criteria"]


@pytest.mark.parametrize(
    "text, missing, reason_part",
    [
        ("no json at all", ALL_REQUIRED, "no JSON object"),
        ('{"is_final_answer": true}', ALL_REQUIRED[1:], "missing field"),
        (VERDICT.replace("true", '"true"'), ["is_final_answer"], "is_final_answer should be bool, got string"),
        (VERDICT.replace('["budget"]', "3"), ["missing_rubric_criteria"], "should be list, got number"),
        ("{'is_final_answer': True}", ALL_REQUIRED, "no JSON object"),  # Python, not JSON
        ('```json\n{"is_final_answer": tru', ALL_REQUIRED, "no JSON object"),  # cut off
    ],
)
def test_json_invalid(text, missing, reason_part):
    r = json_reply(text, JUDGE)
    assert not r.ok
    assert r.missing == missing
    assert reason_part in r.reason


@pytest.mark.parametrize(
    "value, typ, ok",
    [
        ('"1"', "number", False),  # a numeric string is not a number
        ('"true"', "bool", False),  # nor is a string a bool
        ("true", "bool", True),
        ("1.5", "number", True),
        ("-2", "number", True),
        ("true", "number", False),  # bool is not a number
        ('"s"', "string", True),
        ("[]", "list", True),
        ("{}", "list", False),
        ("null", "any", True),
        ("{}", "any", True),
        ("null", "string", False),
        ("null", "string?", True),
    ],
)
def test_json_types(value, typ, ok):
    assert json_reply('{"v": %s}' % value, {"v": typ}).ok is ok


def test_json_optional_field_may_be_absent():
    assert json_reply("{}", {"v": "string?"}).ok


def test_json_answer_field():
    assert json_reply('{"answer": 12}', {"answer": "number"})["answer"] == "12"


@pytest.mark.parametrize("schema", [{"v": "integer"}, {"text": "string"}, {"": "bool"}, {"v": 3}])
def test_json_bad_schema_raises(schema):
    with pytest.raises(ValueError):
        json_reply("{}", schema)


def test_json_adversarial_braces_is_fast():
    r = json_reply("{" * 100_000, {"v": "any"})
    assert not r.ok


# --------------------------------------------------------------------------- truncation


@pytest.mark.parametrize(
    "finish_reason, text, expected",
    [
        ("length", "#Reasoning# long...", True),
        ("max_tokens", "", True),
        ("MAX_TOKENS", "", True),
        ("stop", "#Reasoning# no question tag", False),
        ("stop", "cut \\boxed{1", False),  # finish reason is authoritative when known
        (None, "cut inside \\boxed{1", True),  # unknown: text heuristics
        (None, "```json\n{", True),
        (None, "complete reply \\boxed{1}", False),
        (None, None, False),
    ],
)
def test_is_truncated(finish_reason, text, expected):
    assert is_truncated(finish_reason, text) is expected


# --------------------------------------------------------------------------- registry


def test_registry_names():
    assert set(PARSERS) == {"text", "sections", "boxed", "summary", "json", "tags"}


@pytest.mark.parametrize(
    "name, args",
    [
        ("text", {}),
        ("boxed", {}),
        ("sections", {"tags": ASK_E_TAGS}),
        ("summary", {"after": "#Summary#", "max_chars": 2000, "keep": "boxed"}),
        ("json", {"schema": {"a": "any"}}),
    ],
)
def test_parse_always_has_text_and_answer(name, args):
    text = "#Question# q #Summary# s \\boxed{9} {\"a\": 1}"
    r = parse(name, text, args, finish_reason="length")
    assert isinstance(r, ParsedReply)
    assert r["text"] == text
    assert r["answer"] == "9"
    assert r.truncated is True
    d = r.to_dict()
    assert d["fields"]["text"] == text and set(d) == {"fields", "ok", "missing", "reason", "truncated"}


def test_parse_text_and_boxed_ok_flags():
    assert not parse("text", "   ").ok
    r = parse("boxed", "no box. 5")
    assert not r.ok and r.missing == ["answer"] and r["answer"] == "5"


def test_parse_summary_keep_none():
    r = parse("summary", "\\boxed{3} #Summary# because", {"keep": "none"})
    assert r["summary"] == "because"


@pytest.mark.parametrize(
    "name, args",
    [("nope", {}), ("text", {"x": 1}), ("sections", {}), ("summary", {"keep": "all"})],
)
def test_parse_spec_errors_raise(name, args):
    with pytest.raises(ValueError):
        parse(name, "text", args)


# --------------------------------------------------------------------------- never raise

TAGGY = st.one_of(
    st.text(max_size=300),
    st.lists(
        st.sampled_from(
            ["#Reasoning#", "#Draft#", "#Question#", "#Summary#", "#Output#", "\\boxed{", "\\boxed",
             "}", "{", "\\{", "\\}", "```json\n", "```", '{"a": 1}', "**", "$", "\\fbox ", " ", "\n",
             "42", ".", "x"]
        ),
        max_size=60,
    ).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(
    text=TAGGY,
    n=st.integers(-3, 50),
    reason=st.one_of(st.none(), st.sampled_from(["length", "stop", ""])),
)
def test_parsers_never_raise(text, n, reason):
    r = sections(text, ASK_E_TAGS)
    assert r.ok == (r.missing == [])
    if r.ok:
        assert r["question"]
    b = last_boxed(text)
    assert b is None or (isinstance(b, str) and b == b.strip() and b)
    a = fallback_answer(text)
    assert a is None or (isinstance(a, str) and a)
    s = summary(text, max_chars=max(n, 0))
    assert isinstance(s["summary"], str) and s["summary"]
    json_reply(text, {"a": "number", "b": "string?"})
    w = words(text, n)
    assert len(w.split()) <= max(n, 0)
    is_truncated(reason, text)
    for name, args in [("text", {}), ("boxed", {}), ("sections", {"tags": ASK_E_TAGS}), ("summary", {}),
                       ("json", {"schema": {"a": "any"}})]:
        out = parse(name, text, args, finish_reason=reason)
        assert "text" in out and "answer" in out


@settings(max_examples=100, deadline=None)
@given(
    body=st.text(max_size=400),
    cap=st.integers(0, 300),
    ans=st.text(alphabet="0123456789x+-", min_size=1, max_size=6),
)
def test_summary_always_keeps_final_box(body, cap, ans):
    text = "#Summary# " + body.replace("\\", "") + f" \\boxed{{{ans}}}"
    assert f"\\boxed{{{ans}}}" in summary(text, max_chars=cap)["summary"]


@pytest.mark.parametrize(
    "text, ok, fields",
    [
        ("<problem>What is 2+3?</problem><answer>so \\boxed{5}</answer>", True, {"problem": "What is 2+3?", "answer": "5"}),
        ("<PROBLEM> Q </PROBLEM> <answer>\\boxed{\\frac{1}{2}}</answer>", True, {"problem": "Q", "answer": "\\frac{1}{2}"}),
        ("<problem>old</problem><problem>new</problem><answer>\\boxed{1}</answer>", True, {"problem": "new"}),
        ("<problem>Q</problem><answer>no box here</answer>", False, {"answer": None}),
        ("<problem>Q</problem><answer>\\boxed{5}", False, {"problem": "Q"}),  # unclosed tag: missing
        ("", False, {"problem": None}),
    ],
)
def test_xml_tags_parser(text, ok, fields):
    from askspec.runtime.replies.parsers import parse

    r = parse("tags", text, {"tags": ["problem", "answer"], "boxed": "answer"})
    assert r.ok is ok
    for k, v in fields.items():
        assert r.fields.get(k) == v


def _sections_by_regex_alone(raw, tags):
    """`sections`' fields as the regex scan alone gives them (before the fast paths)."""
    from askspec.runtime.replies.parsers import _tag_regex, field_name

    fields = {field_name(t): None for t in tags}
    occ = [(m.start(), m.end(), m.group("tag")) for m in _tag_regex(tuple(tags)).finditer(raw)]
    last = {tag: i for i, (_, _, tag) in enumerate(occ)}
    for tag, i in last.items():
        end = occ[i + 1][0] if i + 1 < len(occ) else len(raw)
        fields[field_name(tag)] = raw[occ[i][1]:end].strip()
    return fields


@pytest.mark.parametrize("tags", [("#Answer#",), ("#a#",), ("# #a",), ("a",), ("#A#", "#A#B#"), ("#Draft#", "#Question#")])
def test_sections_fast_paths_agree_with_the_regex_scan(tags):
    # replies with no tag or a single one skip the regex; built from the characters that
    # matter (tags, their decorations, whitespace, colons), they must split the same
    import random

    rng = random.Random(14)
    pieces = list(tags) + ["#", "##", "a", "#a", " ", "\t", "\n", "**", "__", "`", ":", "x", "ok", "\\boxed{3}"]
    for _ in range(3000):
        raw = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        got = sections(raw, list(tags))
        want = _sections_by_regex_alone(raw, tags)
        if "answer" in want:  # a section named answer is given as its final answer
            want["answer"] = fallback_answer(want["answer"] or raw)
        assert {k: got.fields[k] for k in want} == want, (raw, tags)
