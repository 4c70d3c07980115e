"""Static types of the expression language and the signatures of its built-in functions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class T:
    """A type: scalar name, `list` with elem, `record` with fields (None = open), or
    `role` (a role view whose `turns` are replies)."""

    name: str
    elem: "T | None" = None
    fields: tuple[tuple[str, "T"], ...] | None = None
    role: str | None = None

    def __str__(self) -> str:
        if self.name == "list":
            return f"list[{self.elem}]"
        if self.name == "record" and self.fields is not None:
            inner = ", ".join(f"{k}: {v}" for k, v in self.fields[:6])
            return "{" + inner + (", ..." if len(self.fields) > 6 else "") + "}"
        if self.name == "role":
            return f"role {self.role}"
        return self.name

    def field(self, name: str) -> "T | None":
        if self.fields is None:
            return ANY
        for k, v in self.fields:
            if k == name:
                return v
        return None


NUM = T("number")
BOOL = T("bool")
STR = T("string")
ANY = T("any")
OUTCOME = T("outcome")
TEMPLATE = T("template")
OPEN_RECORD = T("record")


def list_of(t: T) -> T:
    return T("list", elem=t)


def record(fields: dict[str, T]) -> T:
    return T("record", fields=tuple(fields.items()))


def is_a(actual: T, expected: T) -> bool:
    """Whether a value of type `actual` may be used where `expected` is required."""
    if actual.name == "any" or expected.name == "any":
        return True
    if expected.name == "number" and actual.name == "bool":
        return False
    if actual.name != expected.name:
        return False
    if actual.name == "list":
        return is_a(actual.elem or ANY, expected.elem or ANY)
    return True


def numeric(t: T) -> bool:
    return t.name in ("number", "any")


def boolish(t: T) -> bool:
    return t.name in ("bool", "any")


def unify(a: T, b: T) -> T:
    if a.name == "any":
        return b
    if b.name == "any":
        return a
    if a == b:
        return a
    if a.name == b.name == "list":
        return list_of(unify(a.elem or ANY, b.elem or ANY))
    if a.name == b.name:
        return a if a.fields else b
    return ANY


REPLY_BASE = {
    "text": STR,
    "answer": STR,
    "parsed": BOOL,
    "truncated": BOOL,
    "finish_reason": STR,
    "tokens": NUM,
    "role": STR,
    "model": STR,
}


def reply_type(parser_fields: dict[str, T], role: str | None = None) -> T:
    """The record a role's reply is parsed into; `role` remembers whose reply it is."""
    fields = dict(REPLY_BASE)
    fields.update(parser_fields)
    return T("record", fields=tuple(fields.items()), role=role)


def from_json_value(value) -> T:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, (int, float)):
        return NUM
    if isinstance(value, str):
        return STR
    if isinstance(value, list):
        elem = ANY
        for i, v in enumerate(value):
            elem = from_json_value(v) if i == 0 else unify(elem, from_json_value(v))
        return list_of(elem)
    if isinstance(value, dict):
        return record({k: from_json_value(v) for k, v in value.items()})
    return ANY


TYPE_NAMES = {"number": NUM, "int": NUM, "float": NUM, "bool": BOOL, "string": STR, "str": STR, "any": ANY}
