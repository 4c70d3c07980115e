"""AST of the .ask language. Every node keeps its Span. Nodes compare by identity
(`eq=False`) so passes can key side tables on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..span import Span


@dataclass(eq=False)
class Node:
    span: Span


# ---- expressions ---------------------------------------------------------------------
@dataclass(eq=False)
class Number(Node):
    value: float | int


@dataclass(eq=False)
class String(Node):
    value: str
    # line/col where the string's content starts (for diagnostics inside inline templates)
    content_line: int = 0
    content_col: int = 0
    long: bool = False


@dataclass(eq=False)
class Bool(Node):
    value: bool


@dataclass(eq=False)
class Name(Node):
    id: str


@dataclass(eq=False)
class ListLit(Node):
    items: list["Expr"]


@dataclass(eq=False)
class RecordLit(Node):
    fields: list[tuple[str, "Expr"]]


@dataclass(eq=False)
class Call(Node):
    func: str
    func_span: Span
    args: list["Expr"]
    kwargs: list[tuple[str, "Expr"]] = field(default_factory=list)


@dataclass(eq=False)
class Attr(Node):
    obj: "Expr"
    name: str


@dataclass(eq=False)
class Index(Node):
    obj: "Expr"
    index: "Expr"


@dataclass(eq=False)
class Unary(Node):
    op: str  # "-" | "not"
    operand: "Expr"


@dataclass(eq=False)
class Binary(Node):
    op: str  # + - * / % == != < <= > >= and or
    left: "Expr"
    right: "Expr"


@dataclass(eq=False)
class Case(Node):
    subject: "Expr | None"
    arms: list[tuple["Expr", "Expr"]]
    default: "Expr | None"


@dataclass(eq=False)
class Where(Node):
    seq: "Expr"
    cond: "Expr"


Expr = Union[Number, String, Bool, Name, ListLit, RecordLit, Call, Attr, Index, Unary, Binary, Case, Where]


# ---- block contents ------------------------------------------------------------------
@dataclass(eq=False)
class Attribute(Node):
    name: str
    value: Expr
    name_span: Span


@dataclass(eq=False)
class Flag(Node):
    name: str


@dataclass(eq=False)
class TypeExpr(Node):
    name: str
    args: list["TypeExpr"] = field(default_factory=list)

    def __str__(self) -> str:
        return self.name + (f"[{', '.join(map(str, self.args))}]" if self.args else "")


# ---- statements ----------------------------------------------------------------------
@dataclass(eq=False)
class Ask(Node):
    roles: list[tuple[str, Span]]
    sample: Expr | None
    using: Expr | None
    message: Expr | None
    with_: Expr | None
    sampling: "list[Attribute] | None" = None  # `with sampling { ... }`: this ask's sampling fields
    # `with sampling { ROLE { ... } }`: one role's own fields over the shared ones
    role_sampling: "list[RoleSampling] | None" = None


@dataclass(eq=False)
class RoleSampling(Node):
    role: str
    role_span: Span
    attrs: "list[Attribute]"


@dataclass(eq=False)
class Assign(Node):
    targets: list[tuple[str, Span]]
    value: "Expr | Ask"


@dataclass(eq=False)
class AskStmt(Node):
    ask: Ask


@dataclass(eq=False)
class Repeat(Node):
    var: tuple[str, Span] | None
    start: Expr | None  # None for `repeat N`
    stop: Expr  # inclusive upper bound, or the count for `repeat N`
    body: list["Stmt"]


@dataclass(eq=False)
class While(Node):
    cond: Expr
    limit: Expr | None
    until: bool
    body: list["Stmt"]


@dataclass(eq=False)
class For(Node):
    pattern: list[tuple[str, Span]]
    iter: Expr
    limit: Expr | None
    body: list["Stmt"]


@dataclass(eq=False)
class If(Node):
    branches: list[tuple[Expr, list["Stmt"]]]
    orelse: list["Stmt"] | None


@dataclass(eq=False)
class Reward(Node):
    target: str
    target_span: Span
    name: str | None
    value: Expr


@dataclass(eq=False)
class Bind(Node):
    role: str
    role_span: Span
    value: Expr


@dataclass(eq=False)
class End(Node):
    outcome: tuple[str, Span] | None


@dataclass(eq=False)
class Outcomes(Node):
    names: list[tuple[str, Span]]


@dataclass(eq=False)
class Drop(Node):
    """`drop X`: the turns held in X (a reply, a list of replies) or all of role X's turns
    in this session are recorded but not trained on."""

    target: str
    target_span: Span


@dataclass(eq=False)
class Push(Node):
    """`push BUFFER: value`: append a record to a declared buffer."""

    buffer: str
    buffer_span: Span
    value: Expr


@dataclass(eq=False)
class RouteArm(Node):
    cond: Expr | None  # None for else
    target: str  # keep | drop | resample | tournament | judge
    target_span: Span
    arg: tuple[str, Span] | None


@dataclass(eq=False)
class Route(Node):
    role: str
    role_span: Span
    arms: list[RouteArm]


Stmt = Union[Assign, AskStmt, Repeat, While, For, If, Reward, Bind, End, Outcomes, Route, Drop, Push]


# ---- declarations --------------------------------------------------------------------
@dataclass(eq=False)
class Param(Node):
    name: str
    name_span: Span
    type: TypeExpr | None
    default: Expr


@dataclass(eq=False)
class Experiment(Node):
    name: str
    params: list[Param]
    attrs: list[Attribute]


@dataclass(eq=False)
class ModelDecl(Node):
    name: str
    name_span: Span
    base: Expr  # backend call like hf("...") or the Name of another model
    attrs: list[Attribute]


@dataclass(eq=False)
class RoleDecl(Node):
    names: list[tuple[str, Span]]
    attrs: list[Attribute]
    flags: list[Flag]


@dataclass(eq=False)
class TemplateDecl(Node):
    name: str
    name_span: Span
    value: Expr


@dataclass(eq=False)
class DataDecl(Node):
    name: str
    name_span: Span
    source: Expr
    attrs: list[Attribute]


@dataclass(eq=False)
class BlockDecl(Node):
    """buffer / tournament / judge / schedule: a named block of attributes."""

    kind: str
    name: str
    name_span: Span
    attrs: list[Attribute]


@dataclass(eq=False)
class StageDecl(Node):
    """`stage NAME KIND { settings }`: one stage of the experiment (sft, train, evaluate)."""

    name: str
    name_span: Span
    kind: str
    kind_span: Span
    attrs: list[Attribute]


@dataclass(eq=False)
class TrainDecl(Node):
    role: str
    role_span: Span
    algo: Expr
    attrs: list[Attribute]


@dataclass(eq=False)
class MetricDecl(Node):
    name: str
    name_span: Span
    value: Expr
    by: list[tuple[str, Span]]


@dataclass(eq=False)
class GameDecl(Node):
    name: str
    name_span: Span
    pattern: list[tuple[str, Span]]
    iter: Expr | None
    times: Expr | None
    sample: Expr | None
    body: list[Stmt]


@dataclass(eq=False)
class ProfileModel(Node):
    """`model NAME [= BASE] [{ ... }]` in a profile: replace the model (with `=`) or
    override settings of its body."""

    name: str
    name_span: Span
    base: Expr | None
    attrs: list[Attribute]


@dataclass(eq=False)
class ProfileTrain(Node):
    """`train ROLE [with ALGORITHM] [{ ... }]` in a profile: another algorithm and/or
    settings for the role's train block."""

    role: str
    role_span: Span
    algo: Expr | None
    attrs: list[Attribute]


@dataclass(eq=False)
class ProfileDecl(Node):
    """`profile NAME { ... }`: a named configuration of the experiment (a `schedule`
    item, a BlockDecl, replaces the spec's schedule)."""

    name: str
    name_span: Span
    items: list[Param | ProfileModel | ProfileTrain | BlockDecl]


Decl = Union[Experiment, Param, ModelDecl, RoleDecl, TemplateDecl, DataDecl, BlockDecl, TrainDecl, MetricDecl, GameDecl,
             ProfileDecl]


@dataclass(eq=False)
class Module(Node):
    path: str
    decls: list[Decl]


def names_in(e) -> set[str]:
    """Every name an expression (or any node) mentions."""
    out: set[str] = set()
    if isinstance(e, Name):
        out.add(e.id)
    elif e is None:
        return out
    for v in getattr(e, "__dict__", {}).values():
        if isinstance(v, Node):
            out |= names_in(v)
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, Node):
                    out |= names_in(x)
                elif isinstance(x, tuple):
                    for y in x:
                        if isinstance(y, Node):
                            out |= names_in(y)
    return out
