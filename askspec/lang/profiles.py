"""Profiles: named configurations of one experiment (`profile benchmark { ... }`).

A profile overrides declared parameters, models and train blocks, and may replace the
schedule (`schedule online { ... }` in a profile stands for the spec's schedule block, or
is the schedule of a spec that declares none: PasoDoble's online and offline); one switch
(`--profile NAME`, else the experiment's `profile = NAME` setting) selects it. The
selected profile is applied to the AST before anything is checked, so the IR is that
configuration's and every later diagnostic points at the text that produced the value
(an override's value is checked where the profile wrote it). Every profile's overrides
are checked to name something the spec declares (E113), the unselected ones included,
so a typo in a configuration nobody ran today is still found."""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import ast as A
from ..diagnostics import DiagnosticSink
from ..span import Span
from .exprs import suggest


@dataclass
class Selection:
    decls: list            # the module's declarations with the profile applied
    profile: str | None    # the selected profile, None when none is
    names: list[str]       # every declared profile, in order


def select(decls: list, chosen: str | None, sink: DiagnosticSink) -> Selection:
    profiles = [d for d in decls if isinstance(d, A.ProfileDecl)]
    rest = [d for d in decls if not isinstance(d, A.ProfileDecl)]
    by_name: dict[str, A.ProfileDecl] = {}
    for p in profiles:
        if p.name in by_name:
            d = sink.error("E104", f"profile '{p.name}' is declared twice", p.name_span)
            d.notes.append(("first declared here", by_name[p.name].name_span))
            continue
        by_name[p.name] = p
    for p in by_name.values():
        _check_names(p, rest, sink)
    name = chosen if chosen is not None else _default(rest, by_name, sink)
    if name is None:
        return Selection(rest, None, list(by_name))
    if name not in by_name:
        hint = suggest(name, by_name) or (f"profiles: {', '.join(by_name)}" if by_name
                                          else "this spec declares no profiles")
        sink.error("E112", f"--profile {name}: no profile named '{name}'", None, hint)
        return Selection(rest, None, list(by_name))
    return Selection(_apply(by_name[name], rest), name, list(by_name))


def _default(decls: list, by_name: dict[str, A.ProfileDecl], sink: DiagnosticSink) -> str | None:
    """The experiment's `profile = NAME` (a name or a string), checked to exist."""
    for e in decls:
        if not isinstance(e, A.Experiment):
            continue
        for a in e.attrs:
            if a.name != "profile":
                continue
            v = a.value
            name = v.id if isinstance(v, A.Name) else v.value if isinstance(v, A.String) else None
            if name is None:
                sink.error("E107", "the default profile is a profile's name: profile = NAME", v.span)
                return None
            if name not in by_name:
                sink.error("E112", f"unknown profile '{name}'", v.span,
                           suggest(name, by_name) or (f"profiles: {', '.join(by_name)}" if by_name
                                                      else "declare it: profile NAME { ... }"))
                return None
            return name
        return None
    return None


def _declared(decls: list) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {"param": {}, "model": {}, "train": {}}
    for d in decls:
        if isinstance(d, A.Experiment):
            for p in d.params:
                out["param"][p.name] = p
        elif isinstance(d, A.Param):
            out["param"][d.name] = d
        elif isinstance(d, A.ModelDecl):
            out["model"].setdefault(d.name, d)
        elif isinstance(d, A.TrainDecl):
            out["train"].setdefault(d.role, d)
    return out


def _item_key(item) -> tuple[str, str, Span]:
    if isinstance(item, A.BlockDecl):  # a schedule: one per profile, whatever its kind
        return "schedule", "schedule", item.span
    if isinstance(item, A.Param):
        return "param", item.name, item.name_span
    if isinstance(item, A.ProfileModel):
        return "model", item.name, item.name_span
    return "train", item.role, item.role_span


def _check_names(p: A.ProfileDecl, decls: list, sink: DiagnosticSink) -> None:
    declared = _declared(decls)
    seen: dict[tuple[str, str], Span] = {}
    for item in p.items:
        kind, name, span = _item_key(item)
        if (kind, name) in seen:
            what = "the schedule" if kind == "schedule" else f"{kind} '{name}'"
            d = sink.error("E104", f"profile '{p.name}' sets {what} twice", span)
            d.notes.append(("first set here", seen[(kind, name)]))
            continue
        seen[(kind, name)] = span
        if kind == "schedule":
            continue  # replaces the spec's schedule or adds one; checked as a schedule when selected
        if name not in declared[kind]:
            what = {"param": "no parameter", "model": "no model", "train": "no train block for role"}[kind]
            sink.error("E113", f"profile '{p.name}' overrides {what} '{name}'", span,
                       suggest(name, declared[kind]) or f"a profile overrides what the spec declares; declare the "
                                                        f"{'train block' if kind == 'train' else kind} outside the profile first")
        if isinstance(item, A.Param) and item.type is not None:
            sink.error("E107", f"profile '{p.name}' gives parameter '{name}' a type; it keeps its declared one",
                       item.type.span, f"write: param {name} = ...")


def _merge(attrs: list[A.Attribute], over: list[A.Attribute]) -> list[A.Attribute]:
    """`attrs` with each of `over` replacing the setting of its name, or added."""
    names = {a.name for a in over}
    return [a for a in attrs if a.name not in names] + list(over)


def _apply(p: A.ProfileDecl, decls: list) -> list:
    params = {i.name: i for i in p.items if isinstance(i, A.Param)}
    models = {i.name: i for i in p.items if isinstance(i, A.ProfileModel)}
    trains = {i.role: i for i in p.items if isinstance(i, A.ProfileTrain)}
    schedule = next((i for i in p.items if isinstance(i, A.BlockDecl)), None)

    def param(q: A.Param) -> A.Param:
        o = params.get(q.name)
        return replace(q, default=o.default) if o is not None else q

    out = []
    for d in decls:
        if isinstance(d, A.Experiment):
            d = replace(d, params=[param(q) for q in d.params])
        elif isinstance(d, A.Param):
            d = param(d)
        elif isinstance(d, A.ModelDecl) and d.name in models:
            o = models[d.name]
            # `model m = base { ... }` replaces the declaration; `model m { ... }` overrides settings
            d = replace(d, base=o.base, attrs=o.attrs) if o.base is not None else replace(d, attrs=_merge(d.attrs, o.attrs))
        elif isinstance(d, A.TrainDecl) and d.role in trains:
            t = trains[d.role]
            d = replace(d, algo=t.algo if t.algo is not None else d.algo, attrs=_merge(d.attrs, t.attrs))
        elif isinstance(d, A.BlockDecl) and d.kind == "schedule" and schedule is not None:
            # the whole block: another kind's settings do not mix with the spec's
            d, schedule = schedule, None
        out.append(d)
    if schedule is not None:  # the spec declares none (online by default)
        out.append(schedule)
    return out
