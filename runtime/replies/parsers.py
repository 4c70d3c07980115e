"""Reply parsers: turn a model's raw reply text into named fields.

This module owns everything between "a backend returned a string" and "the engine has
named values to forward, score and record": tagged sections (Ask-E's ``#Reasoning#`` /
``#Draft#`` / ``#Question#``), ``\\boxed{}`` extraction, Ask-E's boundary-model summary
rule, JSON replies checked against a small schema, word truncation, the final-answer
fallback, and the truncated-vs-malformed distinction used to pick a recovery prompt.

Every function here is pure (no model calls, no I/O) and never raises on any text input:
a model can emit anything, and a parser failure must become data (``ok=False`` plus the
``missing`` parts), never an exception in the engine. Arguments that come from the spec
(tag lists, JSON schemas, parser names) *are* validated eagerly and raise ``ValueError``,
because those are author errors the checker should surface before a run starts.

The occurrence rules, with their sources in the Ask-E paper (``papers/ask_e.txt``):

* ``sections``: the LAST occurrence of each tag wins; its content runs to the next
  occurrence of any known tag, or to the end of the text; whitespace is stripped
  (App. B: "Output exactly one #Reasoning# ... one #Question# section per turn";
  App. F "Tag-based parsing": "Only the content following the questioner's #Question#
  tag is forwarded").
* ``summary``: App. D and App. F "Boundary models -> Questioner" (quoted on `summary`).
* ``fallback_answer``: App. F "Scoring details" / App. G "Answer extraction": "scan for
  \\boxed{...} occurrences and return the contents of the last one. If no \\boxed
  appears, return the last non-punctuation word of the response."
* ``words``: App. F: "The forwarded question is truncated to 200 words".
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Final, Iterable, Mapping, Sequence

from askspec.ir.vocab import PARSERS as KINDS
from askspec.ir.vocab import SUMMARY_KEEP, SUMMARY_MAX_CHARS, SUMMARY_TAGS, tag_field

__all__ = [
    "ParsedReply",
    "NO_SUMMARY_PLACEHOLDER",
    "SUMMARY_TAGS",
    "SCHEMA_TYPES",
    "sections",
    "last_boxed",
    "summary",
    "json_reply",
    "words",
    "fallback_answer",
    "is_truncated",
    "field_name",
    "parse",
    "compile_parser",
    "compile_fields",
    "PARSERS",
]

# The paper gives no literal wording, only that the placeholder indicates "the model
# failed to produce a structured answer" (App. F); this constant says exactly that.
NO_SUMMARY_PLACEHOLDER = "(The model failed to produce a structured answer.)"

# Field names every parse() result carries; spec-declared parts may not reuse `text`.
RESERVED_FIELDS = frozenset({"text"})


@dataclass
class ParsedReply:
    """The result of parsing one reply.

    ``fields`` holds the named parts (``None`` for a part that was not found); every
    result from ``parse`` also has ``text`` (the raw reply) and ``answer``
    (`fallback_answer` of the relevant part). ``ok`` is True when every required part
    was found; ``missing`` names the required parts that were not; ``reason`` is a short
    human-readable explanation when ``ok`` is False; ``truncated`` records whether the
    reply was cut off by the token limit (so the engine can choose the recovery variant).
    """

    fields: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    missing: list[str] = field(default_factory=list)
    reason: str | None = None
    truncated: bool = False

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for the run store."""
        return {
            "fields": dict(self.fields),
            "ok": self.ok,
            "missing": list(self.missing),
            "reason": self.reason,
            "truncated": self.truncated,
        }


def _as_text(text: Any) -> str:
    """Coerce any input to a string without raising (None -> "")."""
    if text is None:
        return ""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    try:
        return str(text)
    except Exception:  # an object whose __str__ raises is still "no usable text"
        return ""


# --------------------------------------------------------------------------- sections


@lru_cache(maxsize=1024)
def field_name(tag: str) -> str:
    """Spec-level field name of a tag, by the rule the checker names the IR's fields with
    (askspec.ir.vocab.tag_field): letters, digits and underscores, lowercased.

    ``"#Question#"`` -> ``"question"``, ``"#Final_Answer#"`` -> ``"final_answer"``,
    ``"#Final Answer#"`` -> ``"finalanswer"``.
    """
    return tag_field(tag)


# what `_tag_regex` lets follow a tag (always matches, possibly empty)
_TAG_SUFFIX = re.compile(r"(?:\*\*|__|`)?[ \t]*:?")


@lru_cache(maxsize=256)
def _tag_regex(tags: tuple[str, ...]) -> re.Pattern[str]:
    # Longest tags first so that one tag being a prefix of another cannot shadow it.
    alternation = "|".join(re.escape(t) for t in sorted(set(tags), key=len, reverse=True))
    # Markdown decoration models often add around a tag ("**#Question#**", "`#Draft#`",
    # "## #Summary#", "#Question#:") is consumed together with the tag, so it neither
    # ends up at the head of this section nor at the tail of the previous one.
    return re.compile(
        r"(?:(?m:^)[ \t]*#{1,6}[ \t]+)?"
        r"(?:\*\*|__|`)?"
        r"(?P<tag>" + alternation + r")"
        r"(?:\*\*|__|`)?[ \t]*:?"
    )


def _tag_occurrences(text: str, tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """All (start, end, tag) occurrences, left to right, non-overlapping."""
    if not tags:
        return []
    rx = _tag_regex(tuple(tags))
    return [(m.start(), m.end(), m.group("tag")) for m in rx.finditer(text)]


@lru_cache(maxsize=256)
def _checked_tags(tags: tuple[str, ...], what: str) -> list[str]:
    """`_check_tags` memoised: a role's tags are validated once, not on every reply."""
    return _check_tags(tags, what)


def _check_tags(tags: Sequence[str], what: str) -> list[str]:
    if isinstance(tags, str):
        tags = [tags]
    tags = list(tags)
    if not tags:
        raise ValueError(f"{what}: at least one tag is required")
    names = [field_name(t) for t in tags]
    for tag, name in zip(tags, names):
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"{what}: tags must be non-empty strings, got {tag!r}")
        if not name:
            raise ValueError(f"{what}: tag {tag!r} has no letters or digits to name a field")
        if name in RESERVED_FIELDS:
            raise ValueError(f"{what}: tag {tag!r} would shadow the reserved field {name!r}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{what}: several tags map to the same field name: {', '.join(dupes)}")
    return tags


def sections(
    text: Any,
    tags: Sequence[str],
    required: Sequence[str] | None = None,
) -> ParsedReply:
    """Split a reply into tagged sections.

    Rule (documented contract):

    * A tag matches as the exact, case-sensitive tag string anywhere in the text (the
      prompts tell the model to use the tags "exactly as shown"), optionally wrapped in
      markdown (``**#Question#**``, ```#Question#```, a ``## `` heading prefix, a
      trailing colon); the decoration is not part of any section.
    * For each tag the LAST occurrence is used; the section's content runs from the end
      of that occurrence to the start of the next occurrence of ANY known tag, or to the
      end of the text, and is stripped of surrounding whitespace.
    * Field names are `field_name(tag)` (``#Question#`` -> ``question``). A tag that
      never occurs gives ``None``; one that occurs with nothing after it gives ``""``.
    * ``required`` (tags or field names; default: the last tag in ``tags``) lists the
      sections that must be present AND non-empty: an empty ``#Question#`` is as
      unusable as a missing one. ``ok`` is True iff none is missing.
    * ``answer`` is `fallback_answer` of a section named ``answer`` when one is
      declared, else of the whole reply (for Ask-E's questioner that is the draft's
      ``\\boxed{}`` solution).
    """
    tags_t = (tags,) if isinstance(tags, str) else tuple(tags)
    if required is not None:
        required = (required,) if isinstance(required, str) else tuple(required)
    return _sections_run(_as_text(text), _sections_setup(tags_t, required))


# (tags, names, tag -> name, required names, the tag regex): what `sections` derives from
# its arguments, once per distinct arguments rather than on every reply
_SectionsSetup = tuple[tuple[str, ...], tuple[str, ...], dict[str, str], tuple[str, ...], re.Pattern[str]]


@lru_cache(maxsize=256)
def _sections_setup(tags: tuple[str, ...], required: tuple[str, ...] | None,
                    given: tuple[str, ...] | None = None) -> _SectionsSetup:
    checked = tuple(_checked_tags(tags, "sections"))
    names = _named(checked, given)
    by_tag = dict(zip(checked, names))
    required_names: tuple[str, ...]
    if required is None:
        required_names = (names[-1],)
    else:
        req = []
        for r in required:
            name = by_tag.get(r, field_name(r))
            if name not in names:
                raise ValueError(f"sections: required part {r!r} is not one of the tags {list(checked)}")
            req.append(name)
        required_names = tuple(req)
    return checked, names, by_tag, required_names, _tag_regex(checked)


def _named(tags: Sequence[str], given: Sequence[str] | None) -> tuple[str, ...]:
    """The tags' field names: `given` (the IR's, `ReplyParser.fields`, which the checker
    named by the same rule) when the caller has them, else `field_name`'s."""
    if given is None:
        return tuple(field_name(t) for t in tags)
    if len(given) < len(tags):
        raise ValueError(f"{len(tags)} tags but {len(given)} field names")
    return tuple(given[:len(tags)])


def _sections_run(raw: str, setup: _SectionsSetup) -> ParsedReply:
    fields, missing = _sections_fields(raw, setup)
    reason = None
    if missing:
        reason = "missing or empty section(s): " + ", ".join(missing)
    return ParsedReply(fields=fields, ok=not missing, missing=missing, reason=reason)


def _sections_fields(raw: str, setup: _SectionsSetup) -> tuple[dict[str, Any], list[str]]:
    """`sections`' fields (text and answer included) and the required parts missing."""
    tags, names, by_tag, required_names, rx = setup
    fields: dict[str, Any] = dict.fromkeys(names)
    # The regex can only match where a tag occurs verbatim, so a reply without any skips
    # it; one where a single tag occurs exactly once (no other occurrence, overlapping
    # or not, of any tag) has exactly one match, with its tag there, and its section runs
    # from the match's end (the tag and its trailing decoration) to the end of the text.
    single: tuple[str, int] | None = None
    for t in tags:
        p = raw.find(t)
        if p < 0:
            continue
        if single is not None or raw.find(t, p + 1) >= 0:
            single = None
            occ = [(*m.span(), m[1]) for m in rx.finditer(raw)]  # (start, end, tag)
            last_index: dict[str, int] = {}
            for i, (_, _, tag) in enumerate(occ):
                last_index[tag] = i
            for tag, i in last_index.items():
                start = occ[i][1]
                end = occ[i + 1][0] if i + 1 < len(occ) else len(raw)
                fields[by_tag[tag]] = raw[start:end].strip()
            break
        single = (t, p)
    if single is not None:
        t, p = single
        fields[by_tag[t]] = raw[_TAG_SUFFIX.match(raw, p + len(t)).end():].strip()  # type: ignore[union-attr]
    missing = [n for n in required_names if not fields[n]]
    answer = fields.get("answer")
    fields["text"] = raw
    fields["answer"] = fallback_answer(answer if answer else raw)
    return fields, missing


# --------------------------------------------------------------------------- boxed

_BOX_RX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


class _Cut(enum.Enum):
    UNBALANCED = "unbalanced"  # a box whose brace group the reply's end cut off


_UNBALANCED: Final = _Cut.UNBALANCED
# Sentence punctuation that may trail a space-separated "\boxed 5." token.
_TOKEN_TRAIL = ".,;:!?"


def _read_box(text: str, start: int) -> tuple[str, int] | _Cut | None:
    """Parse the box whose command ends at ``start``.

    Returns (content, end) for a balanced ``{...}`` group or a single token, None when
    the command has no argument at all, or _UNBALANCED for an unclosed brace group.
    """
    n = len(text)
    i = start
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        depth = 0
        j = i
        while j < n:
            ch = text[j]
            if ch == "\\" and j + 1 < n and text[j + 1] in "{}\\":
                # Escaped brace (\{ \}) or backslash: literal, does not change depth.
                j += 2
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j], j + 1
            j += 1
        return _UNBALANCED
    if i == start:
        # "\boxed5" is not a LaTeX box argument we recognise; "\boxed" at the very end is
        # an unfinished command.
        return _UNBALANCED if i >= n else None
    # "\boxed 5": a single whitespace-delimited token (math delimiters end it too).
    j = i
    while j < n and not text[j].isspace() and text[j] not in "$":
        j += 1
    token = text[i:j]
    stripped = token.rstrip(_TOKEN_TRAIL)
    if not stripped:
        return _UNBALANCED if j >= n else None
    return stripped, i + len(stripped)


def _last_box_span(text: str) -> tuple[str, int, int] | _Cut | None:
    """(content, start, end) of the final answer box, None if none, _UNBALANCED if cut."""
    if "\\boxed" not in text and "\\fbox" not in text:  # the common case, without the regex
        return None
    starts = [m for m in _BOX_RX.finditer(text)]
    # Walk backwards from the last occurrence so the cost stays linear: each empty box
    # we skip is short, and the first non-empty one decides.
    for m in reversed(starts):
        res = _read_box(text, m.end())
        if res is None:
            continue
        if res is _UNBALANCED:
            return _UNBALANCED
        content, end = res
        content = content.strip()
        if not content:
            # "\boxed{}" with nothing in it is an echo of the instructions ("put your
            # answer in \boxed{}"), not an answer: look further back.
            continue
        return content, m.start(), end
    return None


def last_boxed(text: Any) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed TOKEN``).

    Nested braces are matched; ``\\{``/``\\}`` are literal. Empty boxes are skipped
    (they echo the instruction "put your answer in \\boxed{}"). If the last non-empty
    box is unbalanced -- the reply was cut off inside it -- the result is None rather
    than an earlier box, because the model was in the middle of revising its answer.
    """
    res = _last_box_span(_as_text(text))
    if res is None or res is _UNBALANCED:
        return None
    return res[0]


# --------------------------------------------------------------------------- answers

# Characters peeled off a fallback word. Leading: quotes / markdown / math delimiters.
# Trailing: the same plus sentence punctuation. A sign or a decimal point inside the
# token is kept ("-3." -> "-3", "0.5." -> "0.5").
_LEAD_STRIP = "\"'`*_$“‘«"
_TRAIL_STRIP = "\"'`*_$”’».,;:!?"
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_MATH_SYMBOLS = frozenset("∅∞")


def _is_word(token: str) -> bool:
    return any(ch.isalnum() or ch in _MATH_SYMBOLS for ch in token)


def _clean_word(token: str) -> str:
    if token.isalnum():  # the common case: nothing to peel
        return token
    prev = None
    while token and token != prev:
        prev = token
        token = token.lstrip(_LEAD_STRIP).rstrip(_TRAIL_STRIP)
        for open_, close in (("\\(", "\\)"), ("\\[", "\\]")):
            if token.startswith(open_):
                token = token[2:]
            if token.endswith(close):
                token = token[:-2]
        # Drop an opening bracket at the front / closing one at the back only when it
        # is unmatched inside the token, so "(1,2)" survives but "(42" and "5)" do not.
        for open_, close in _PAIRS.items():
            if token.startswith(open_) and token.count(open_) > token.count(close):
                token = token[1:]
            if token.endswith(close) and token.count(close) > token.count(open_):
                token = token[:-1]
    return token


def fallback_answer(text: Any) -> str | None:
    """Ask-E's final-answer extraction.

    1. `last_boxed` (the last non-empty, balanced ``\\boxed{}``), if any.
    2. Otherwise the last "non-punctuation word": split the text on whitespace and take
       the last token containing at least one letter or digit (or ∅/∞); then peel off
       surrounding quotes, markdown (``*``, ``_``, backticks), ``$``, ``\\(..\\)``,
       ``\\[..\\]``, unmatched brackets, and trailing sentence punctuation
       (``.,;:!?``). So ``"The answer is -3."`` -> ``"-3"``, ``"**42**!"`` -> ``"42"``,
       ``"is (1,2)."`` -> ``"(1,2)"``, ``"... x = 5 ."`` -> ``"5"``.
    3. None when the text has no such token (empty or punctuation only).

    A reply truncated inside its final ``\\boxed{`` therefore falls back to its last
    word, which the paper accepts: such replies are "usually marked incorrect".
    """
    raw = text if type(text) is str else _as_text(text)
    if raw.isalnum():  # one plain word (no space, no box): the answer is the text itself
        return raw
    boxed = last_boxed(raw)
    if boxed:
        return boxed
    # scan words from the end without splitting a long reply whole
    tail = raw
    tokens: list[str] = []
    while True:
        if not tokens:
            parts = tail.rsplit(None, 32)
            if len(parts) > 32 and parts[0]:
                tail, tokens = parts[0], parts[1:]
            else:
                tail, tokens = "", parts
            if not tokens:
                return None
        token = tokens.pop()
        if token.isalnum():  # the common case: a plain word, nothing to peel
            return token
        if _is_word(token):
            cleaned = _clean_word(token)
            if cleaned and _is_word(cleaned):
                return cleaned


def words(text: Any, n: int) -> str:
    """The text up to and including its ``n``-th whitespace-separated word.

    The original spacing and line breaks inside the kept part are preserved (a question
    keeps its layout); leading/trailing whitespace is dropped. ``n <= 0`` gives "".
    Ask-E forwards questions truncated to 200 words (App. F).
    """
    raw = _as_text(text)
    try:
        n = int(n)
    except (TypeError, ValueError):
        return raw.strip()
    if n <= 0:
        return ""
    count = 0
    for m in re.finditer(r"\S+", raw):
        count += 1
        if count == n:
            return raw[: m.end()].strip()
    return raw.strip()


_LENGTH_REASONS = frozenset({"length", "max_tokens", "max_output_tokens", "model_length"})


def is_truncated(finish_reason: Any, text: Any = None) -> bool:
    """True when a reply was cut off by the token limit rather than being malformed.

    The backend's finish reason decides whenever it is known: ``"length"`` (OpenAI /
    vLLM / our backends; ``max_tokens`` and ``MAX_TOKENS`` spellings of other APIs are
    accepted too) means truncated, anything else means the model stopped on its own.
    Only when the finish reason is missing (``None``/"" -- e.g. a replayed log without
    it) is the text inspected: a reply that ends inside an unclosed ``\\boxed{`` or an
    unclosed code fence was evidently cut off.
    """
    reason = _as_text(finish_reason).strip().lower()
    if reason:
        return reason in _LENGTH_REASONS
    raw = _as_text(text)
    if not raw:
        return False
    if _last_box_span(raw) is _UNBALANCED:
        return True
    return raw.count("```") % 2 == 1


# --------------------------------------------------------------------------- summary


def summary(
    text: Any,
    after: Sequence[str] = SUMMARY_TAGS,
    max_chars: int | None = SUMMARY_MAX_CHARS,
    keep_boxed: bool = True,
) -> ParsedReply:
    """Ask-E's boundary-model summary (App. D and App. F, "Boundary models -> Questioner").

    Paper: "We take everything after the model's last #Summary# (or #Output#) tag,
    truncated to 2,000 characters, with the \\boxed{} answer always preserved
    (re-prepended if it would otherwise fall outside the truncation window or sits above
    the #Summary# tag). If the model emits no #Summary#/#Output# tag at all, only the
    \\boxed{} answer is forwarded; if the response contains neither, a placeholder string
    is forwarded."

    Implemented exactly so:

    * the tag is the LAST occurrence of any tag in ``after`` (markdown decoration around
      it is ignored, as in `sections`);
    * the body is everything after it, leading whitespace dropped, cut to ``max_chars``
      characters (``None`` = no cap), trailing whitespace dropped;
    * the kept answer is the reply's final answer box (the same box `last_boxed`
      picks, written exactly as the model wrote it, e.g. ``\\boxed{67}``); if
      ``keep_boxed`` and that box is not wholly inside the kept window (cut off, or
      above the tag) it is PREPENDED: ``"\\boxed{67}\\n\\n" + body`` -- so the result
      may exceed ``max_chars`` by the box's length;
    * no tag (or a tag with nothing after it): the box alone, when there is one and
      ``keep_boxed``;
    * otherwise `NO_SUMMARY_PLACEHOLDER`.

    Fields: ``summary``, ``answer`` (= `fallback_answer` of the whole reply, the
    paper's final-answer rule), ``text``. ``missing`` contains ``"summary"`` when no tag
    was found and ``"answer"`` when no box was found; ``ok`` iff neither.
    """
    tags = _check_tags(after, "summary")
    raw = _as_text(text)
    occ = _tag_occurrences(raw, tags)
    box = _last_box_span(raw)
    box_span: tuple[str, int, int] | None = box if isinstance(box, tuple) else None
    box_raw = raw[box_span[1] : box_span[2]] if box_span else None

    body = ""
    if occ:
        start = occ[-1][1]
        while start < len(raw) and raw[start].isspace():
            start += 1
        end = len(raw) if max_chars is None else min(len(raw), start + max(0, int(max_chars)))
        body = raw[start:end].rstrip()
        window_end = start + len(body)
        if body and keep_boxed and box_span and box_raw:
            inside = box_span[1] >= start and box_span[2] <= window_end
            if not inside:
                body = f"{box_raw}\n\n{body}"

    if body:
        text_out = body
    elif keep_boxed and box_raw:
        text_out = box_raw
    else:
        text_out = NO_SUMMARY_PLACEHOLDER

    missing = []
    if not occ:
        missing.append("summary")
    if box_span is None:
        missing.append("answer")
    reason = None
    if missing:
        parts = []
        if "summary" in missing:
            parts.append("no " + "/".join(tags) + " tag")
        if "answer" in missing:
            parts.append("no \\boxed{} answer")
        reason = "; ".join(parts)
    return ParsedReply(
        fields={"summary": text_out, "answer": fallback_answer(raw), "text": raw},
        ok=not missing,
        missing=missing,
        reason=reason,
    )


# --------------------------------------------------------------------------- json

SCHEMA_TYPES = frozenset({"bool", "number", "string", "list", "any"})
_FENCE_RX = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\n?(.*?)```", re.S)
# Bounds that keep extraction linear-ish on adversarial text ("{{{{{..." x 100k).
_MAX_JSON_TEXT = 200_000
_MAX_JSON_STARTS = 64
_DECODER = json.JSONDecoder()


def _check_schema(schema: Mapping[str, str]) -> dict[str, tuple[str, bool]]:
    if not isinstance(schema, Mapping):
        raise ValueError("json: schema must be a mapping of field name -> type")
    out: dict[str, tuple[str, bool]] = {}
    for name, typ in schema.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"json: field names must be non-empty strings, got {name!r}")
        if name in RESERVED_FIELDS:
            raise ValueError(f"json: field {name!r} would shadow the reserved field")
        if not isinstance(typ, str):
            raise ValueError(f"json: type of {name!r} must be a string, got {typ!r}")
        optional = typ.endswith("?")
        base = typ[:-1] if optional else typ
        if base not in SCHEMA_TYPES:
            raise ValueError(
                f"json: unknown type {typ!r} for {name!r} (expected one of "
                f"{', '.join(sorted(SCHEMA_TYPES))}, optionally followed by '?')"
            )
        out[name] = (base, optional)
    return out


def _type_ok(value: Any, typ: str) -> bool:
    if typ == "any":
        return True
    if typ == "bool":
        return isinstance(value, bool)
    if typ == "number":
        # bool is an int subclass in Python but "true" is not a number in a schema.
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ == "string":
        return isinstance(value, str)
    if typ == "list":
        return isinstance(value, list)
    return False


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _objects_in(chunk: str, limit: int) -> Iterable[dict[str, Any]]:
    """JSON objects found at '{' positions of ``chunk``, left to right, non-nested."""
    pos = 0
    tried = 0
    while tried < limit:
        i = chunk.find("{", pos)
        if i < 0:
            return
        tried += 1
        try:
            value, end = _DECODER.raw_decode(chunk, i)
        except (ValueError, RecursionError):
            pos = i + 1
            continue
        if isinstance(value, dict):
            yield value
            pos = end  # skip the object's own nested braces
        else:
            pos = i + 1


def _json_candidates(raw: str) -> Iterable[dict[str, Any]]:
    text = raw[:_MAX_JSON_TEXT]
    fenced = [m.group(1) for m in _FENCE_RX.finditer(text)]
    for block in fenced:
        yield from _objects_in(block, _MAX_JSON_STARTS)
    yield from _objects_in(text, _MAX_JSON_STARTS)


def _validate(obj: Mapping[str, Any], schema: dict[str, tuple[str, bool]]) -> tuple[list[str], list[str]]:
    missing = [n for n, (_, opt) in schema.items() if not opt and n not in obj]
    wrong = []
    for name, (typ, optional) in schema.items():
        if name not in obj:
            continue
        value = obj[name]
        if value is None and (optional or typ == "any"):
            continue
        if not _type_ok(value, typ):
            wrong.append(f"{name} should be {typ}, got {_json_type_name(value)}")
    return missing, wrong


def json_reply(text: Any, schema: Mapping[str, str]) -> ParsedReply:
    """Extract a JSON object and check it against ``schema``.

    Candidates, in order: objects inside fenced code blocks (```json ... ``` or bare
    ```), then objects found scanning the whole text left to right (the first balanced
    ``{...}`` that is valid JSON; objects nested in one already taken are not separate
    candidates). The FIRST candidate that satisfies the schema is used; when none does,
    the result is ``ok=False`` with the reason for the first candidate (or "no JSON
    object found"). A judge that first shows an example object and then its verdict is
    thereby still read correctly when the example does not fit the schema.

    Schema types: ``bool``, ``number`` (int or float, not bool), ``string``, ``list``,
    ``any`` (present, any value incl. null). A trailing ``?`` makes a field optional:
    it may be absent or null. Fields: each schema field (``None`` when absent), the whole
    object as ``object``, ``text``, and ``answer`` (the object's ``answer`` value as a
    string when it has a scalar one, else `fallback_answer` of the reply).
    """
    spec = _check_schema(schema)
    raw = _as_text(text)
    first_failure: tuple[dict[str, Any], list[str], list[str]] | None = None
    chosen: dict[str, Any] | None = None
    for obj in _json_candidates(raw):
        missing, wrong = _validate(obj, spec)
        if not missing and not wrong:
            chosen = obj
            break
        if first_failure is None:
            first_failure = (obj, missing, wrong)

    def answer_of(obj: Mapping[str, Any] | None) -> str | None:
        if obj is not None:
            value = obj.get("answer")
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value)
        return fallback_answer(raw)

    if chosen is not None:
        fields = {name: chosen.get(name) for name in spec}
        fields.update(object=chosen, text=raw, answer=answer_of(chosen))
        return ParsedReply(fields=fields, ok=True)

    if first_failure is None:
        fields = {name: None for name in spec}
        fields.update(object=None, text=raw, answer=answer_of(None))
        required = [n for n, (_, opt) in spec.items() if not opt]
        return ParsedReply(fields=fields, ok=False, missing=required, reason="no JSON object found")

    obj, missing, wrong = first_failure
    parts = []
    if missing:
        parts.append("missing field(s): " + ", ".join(missing))
    parts.extend(wrong)
    fields = {name: obj.get(name) for name in spec}
    fields.update(object=obj, text=raw, answer=answer_of(obj))
    bad = missing + [w.split(" ", 1)[0] for w in wrong]
    return ParsedReply(fields=fields, ok=False, missing=bad, reason="; ".join(parts))


# --------------------------------------------------------------------------- registry


def _p_text(text: str, args: Mapping[str, Any]) -> ParsedReply:
    _no_args("text", args)
    ok = bool(text.strip())
    return ParsedReply(
        fields={"text": text, "answer": fallback_answer(text)},
        ok=ok,
        missing=[] if ok else ["text"],
        reason=None if ok else "empty reply",
    )


def _p_boxed(text: str, args: Mapping[str, Any]) -> ParsedReply:
    _no_args("boxed", args)
    box = last_boxed(text)
    ok = box is not None
    return ParsedReply(
        fields={"boxed": box, "text": text, "answer": fallback_answer(text)},
        ok=ok,
        missing=[] if ok else ["answer"],  # the field the spec reads, not the raw box
        reason=None if ok else "no \\boxed{} answer",
    )


def _p_sections(text: str, args: Mapping[str, Any]) -> ParsedReply:
    _no_args("sections", args, ("required",))
    if "tags" not in args:
        raise ValueError("parser 'sections' needs a 'tags' argument")
    return sections(text, args["tags"], args.get("required"))


def _p_summary(text: str, args: Mapping[str, Any]) -> ParsedReply:
    _no_args("summary", args, ("keep_boxed",))
    keep_boxed = args.get("keep_boxed", True)
    if "keep" in args:  # the spec sketch writes `keep = boxed`
        keep = args["keep"]
        if keep not in (*SUMMARY_KEEP, None, True, False):
            raise ValueError(f"parser 'summary': keep must be 'boxed' or 'none', got {keep!r}")
        keep_boxed = keep in ("boxed", True)
    after = args.get("after", SUMMARY_TAGS)
    if isinstance(after, str):
        after = (after,)
    return summary(text, after=after, max_chars=args.get("max_chars", SUMMARY_MAX_CHARS), keep_boxed=bool(keep_boxed))


def _p_json(text: str, args: Mapping[str, Any]) -> ParsedReply:
    _no_args("json", args)  # retries is the engine's business
    return json_reply(text, args.get("schema", {}))


@lru_cache(maxsize=256)
def _xml_tag_regex(tag: str) -> re.Pattern[str]:
    return re.compile(r"<\s*" + re.escape(tag) + r"\s*>(.*?)<\s*/\s*" + re.escape(tag) + r"\s*>", re.DOTALL | re.IGNORECASE)


def xml_tags(text: Any, tags: Sequence[str], boxed: str | None = None, names: Sequence[str] | None = None) -> ParsedReply:
    """XML-style sections `<tag>...</tag>` (PasoDoble's and SOAR's proposer formats).

    Rule: for each tag the LAST complete `<tag>...</tag>` pair counts (tag names match
    case-insensitively; content stripped); an opened but unclosed tag counts as missing.
    Every tag is required. With `boxed = T`, the field `answer` is the last `\boxed{}`
    inside `<T>`, and it must parse as math (math-verify), else `answer` is missing."""
    raw = _as_text(text)
    fields: dict[str, Any] = {}
    missing: list[str] = []
    by_tag = dict(zip(tags, _named(tags, names)))
    for tag in tags:
        name = by_tag[tag]
        found = _xml_tag_regex(tag).findall(raw)
        value = found[-1].strip() if found else None
        fields[name] = value
        if not value:
            missing.append(name)
    if boxed is not None:
        from askspec.runtime.replies.verify import parses_as_math

        inner = fields.get(by_tag.get(boxed, field_name(boxed)))
        box = last_boxed(inner) if inner else None
        fields["answer"] = box
        if not box or not parses_as_math(box):
            if "answer" not in missing:
                missing.append("answer")
    elif "answer" not in fields:
        fields["answer"] = fallback_answer(raw)
    fields["text"] = raw
    reason = ("missing, empty or unparseable: " + ", ".join(missing)) if missing else None
    return ParsedReply(fields=fields, ok=not missing, missing=missing, reason=reason)


def _p_tags(text: str, args: Mapping[str, Any]) -> ParsedReply:
    _no_args("tags", args)
    if not args.get("tags"):
        raise ValueError("parser 'tags' needs a 'tags' argument")
    return xml_tags(text, list(args["tags"]), args.get("boxed"))


def _no_args(name: str, args: Mapping[str, Any], also: Sequence[str] = ()) -> None:
    """Refuse arguments that are not the parser's (askspec.ir.vocab.PARSERS), nor `also`:
    ones this module's callers may pass besides a spec's."""
    allowed = (*KINDS[name].args, *also)
    extra = sorted(set(args) - set(allowed))
    if extra:
        allowed_s = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"parser {name!r}: unknown argument(s) {', '.join(extra)} (allowed: {allowed_s})")


PARSERS: dict[str, Callable[[str, Mapping[str, Any]], ParsedReply]] = {
    "text": _p_text,
    "sections": _p_sections,
    "boxed": _p_boxed,
    "summary": _p_summary,
    "json": _p_json,
    "tags": _p_tags,
}


def parse(
    name: str,
    text: Any,
    args: Mapping[str, Any] | None = None,
    finish_reason: Any = None,
) -> ParsedReply:
    """Run the spec-level parser ``name`` on ``text``.

    Every result has ``text`` and ``answer`` fields and ``truncated`` set from
    `is_truncated` (so the engine can pick the truncated vs malformed recovery prompt).
    Unknown parser names or arguments raise ValueError (spec errors); text never does.
    """
    try:
        fn = PARSERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown parser {name!r} (known: {', '.join(sorted(PARSERS))})") from None
    raw = _as_text(text)
    result = _completed(fn(raw, dict(args or {})), raw)
    result.truncated = is_truncated(finish_reason, raw)
    return result


def _completed(result: ParsedReply, raw: str) -> ParsedReply:
    result.fields.setdefault("text", raw)
    if "answer" not in result.fields:  # not setdefault: fallback_answer is not free
        result.fields["answer"] = fallback_answer(raw)
    return result


def compile_parser(name: str, args: Mapping[str, Any] | None = None) -> Callable[[Any], ParsedReply]:
    """``parse(name, ·, args)`` with the spec's arguments checked once, for a parser that
    runs on every reply of a role: the returned function gives the same result as `parse`
    except ``truncated``, which it leaves False (the engine decides that from the finish
    reason). Raises ValueError now for what `parse` would raise on every call."""
    fn, bound = _bound_parser(name, args)
    if fn is _p_sections:
        setup = _bound_sections(bound)
        return lambda text: _sections_run(_as_text(text), setup)  # sections always sets text and answer

    def run(text: Any) -> ParsedReply:
        raw = _as_text(text)
        return _completed(fn(raw, dict(bound)), raw)

    return run


def compile_fields(name: str, args: Mapping[str, Any] | None = None, names: Sequence[str] | None = None
                   ) -> Callable[[Any], tuple[dict[str, Any], bool, list[str]]]:
    """`compile_parser` giving (fields, ok, missing) of the `ParsedReply`, without building
    one where the parser need not (the engine's per-reply path). `names`: the field names
    of a `sections` or `tags` parser's tags as the IR gives them (`ReplyParser.fields`)."""
    fn, bound = _bound_parser(name, args)
    if fn is _p_tags and names is not None:
        tags, boxed, given = list(bound["tags"]), bound.get("boxed"), tuple(names)

        def run_tags(text: Any) -> tuple[dict[str, Any], bool, list[str]]:
            result = xml_tags(text, tags, boxed, given)
            return result.fields, result.ok, result.missing

        return run_tags
    if fn is _p_sections:
        setup = _bound_sections(bound, None if names is None else tuple(names))

        def run_sections(text: Any) -> tuple[dict[str, Any], bool, list[str]]:
            fields, missing = _sections_fields(text if type(text) is str else _as_text(text), setup)
            return fields, not missing, missing

        return run_sections
    parse_one = compile_parser(name, bound)

    def run(text: Any) -> tuple[dict[str, Any], bool, list[str]]:
        result = parse_one(text)
        return result.fields, result.ok, result.missing

    return run


def _bound_parser(name: str, args: Mapping[str, Any] | None) -> tuple[Callable[[str, Mapping[str, Any]], ParsedReply], dict[str, Any]]:
    try:
        fn = PARSERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown parser {name!r} (known: {', '.join(sorted(PARSERS))})") from None
    bound = dict(args or {})
    fn("", bound)  # the arguments' errors, once
    return fn, bound


def _bound_sections(bound: dict[str, Any], names: tuple[str, ...] | None = None) -> _SectionsSetup:
    tags, required = bound["tags"], bound.get("required")
    if required is not None:
        required = (required,) if isinstance(required, str) else tuple(required)
    return _sections_setup((tags,) if isinstance(tags, str) else tuple(tags), required, names)
