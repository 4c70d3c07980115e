"""The compiler's shared check context: the state every declaration pass reads and fills
(the module's diagnostics, declared names and their uses, parameters, templates, the IR
being built) and the helpers they share (err, declare, const, template). compiler.py runs
an ordered tuple of passes over one context, sqlglot's shape: each pass is its own object
(roles.py, training.py, blocks.py, stages.py, games.py) holding only the context, and
reaches another pass's checks through the context's `role_checks`, `block_checks`, ...,
never through a base class."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..ir import model as ir
from ..ir.vocab import SAMPLING_DEFAULTS
from . import ast as A
from .consts import INVALID, NotConstant, OutOfRange, TooLarge, const_eval
from ..diagnostics import DiagnosticSink, Sources
from .exprs import irspan, suggest
from ..span import Span
from .templates import LoadedTemplate, load_template
from .types import T

if TYPE_CHECKING:
    from .blocks import BlockChecks
    from .roles import RoleChecks
    from .stages import StageChecks
    from .training import TrainingChecks


class CheckContext:
    """What every declaration pass shares: the module being compiled, its diagnostics,
    declared names and their uses, parameters, templates and the IR being built."""

    def __init__(self, path: str, sink: DiagnosticSink, sources: Sources, files: dict[str, str], overrides: dict[str, str],
                 profile: str | None = None, data_files: dict[str, str] | None = None) -> None:
        self.path = path
        self.profile = profile  # --profile NAME; None: the spec's default profile, if any
        self.data_files = data_files or {}  # --data NAME=FILE: a user's file for a data block
        self.spec_dir = os.path.dirname(os.path.abspath(path))
        self.sink = sink
        self.sources = sources
        self.files = files
        self.overrides = overrides
        self.params: dict[str, Any] = {}
        self.param_types: dict[str, T] = {}
        self.param_spans: dict[str, Span] = {}
        self.templates: dict[str, ir.Template] = {}
        self.loaded: dict[str, LoadedTemplate] = {}
        self.decl_spans: dict[tuple[str, str], Span] = {}
        self.used: set[tuple[str, str]] = set()
        self.profile_names: set[str] = set()  # names the profiles mention (profiles.select)
        self.role_decls: dict[str, A.RoleDecl] = {}
        self.written_training: dict[str, dict[str, Any]] = {}  # trained role -> its train block's settings as written
        self.buffer_score_spans: dict[str, Span] = {}
        self.conversation_spans: dict[str, Span] = {}  # shared conversation -> where a role first names it
        self.broken_templates: set[str] = set()  # named templates that failed to load
        self.broken_params: set[str] = set()  # parameters whose default is reported as ill-typed
        self.session_vars: dict[str, dict[str, T]] = {}  # game -> its session variables (set by GameChecker)
        # game -> the variables a session reaching the game's end may not have assigned, each with
        # a path that leaves it unassigned (set by GameChecker; metrics check their reads, E409)
        self.session_unassigned: dict[str, dict[str, str]] = {}
        self.schedule_rewarded: set[str] = set()  # roles the schedule rewards (a nested outer role; compiler.py)
        self.sample_games: set[str] = set()  # games a retrain stage samples items with (compiler.py)
        # the passes (compiler.py makes them): one reaches another's checks only through these
        self.role_checks: RoleChecks
        self.training_checks: TrainingChecks
        self.block_checks: BlockChecks
        self.stage_checks: StageChecks
        self.exp = ir.Experiment(name=os.path.splitext(os.path.basename(path))[0],
                                 sampling_defaults=dict(SAMPLING_DEFAULTS))

    # -- shared helpers
    def err(self, code: str, msg: str, span: Span | None, hint: str | None = None) -> None:
        self.sink.error(code, msg, span, hint)

    def declare(self, kind: str, name: str, span: Span) -> bool:
        key = (kind if kind not in ("tournament", "judge") else "contest", name)
        if key in self.decl_spans:
            prev = self.decl_spans[key]
            d = self.sink.error("E104", f"{kind} '{name}' is declared twice", span)
            d.notes.append(("first declared here", prev))
            return False
        self.decl_spans[key] = span
        return True

    def const(self, e: A.Expr, what: str) -> Any:
        names = A.names_in(e)
        for n in names:
            if n in self.params:
                self.used.add(("param", n))
        if self.broken_params & names:
            return None  # the parameter's own error is reported: its stand-in value proves nothing here
        try:
            return const_eval(e, self.params)
        except OutOfRange as nc:
            self.err("E006", f"{what}: {nc.why}", nc.node.span)
            return None
        except TooLarge as nc:
            self.err("E005", f"{what}: {nc.why}", nc.node.span)
            return None
        except NotConstant as nc:
            self.err("E107", f"{what} must be a constant: {nc.why}", nc.node.span)
            return None

    def const_int(self, e: A.Expr, what: str, minimum: int = 0) -> int | None:
        v = self.const(e, what)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
            self.err("E107", f"{what} must be a whole number ≥ {minimum}, found {v!r}", e.span)
            return None
        return int(v)

    def template(self, e: A.Expr, name: str | None = None) -> str | None:
        if isinstance(e, A.Name):
            key = f"named:{e.id}"
            if key in self.templates:
                self.used.add(("template", e.id))
                return key
            if e.id in self.broken_templates:
                self.used.add(("template", e.id))  # reported once, as broken, not also as unused
                return INVALID
            self.err("E110", f"unknown template '{e.id}'", e.span,
                     suggest(e.id, lambda: [k.split(":", 1)[1] for k in self.templates if k.startswith("named:")]))
            return INVALID
        lt = load_template(e, self.spec_dir, self.path, self.sink, self.files, name)
        if lt is None:
            return INVALID  # reported; keeps later checks from reporting a missing template again
        if lt.path is not None:
            self.sources.add(lt.display_path, lt.source)
        self.loaded[lt.key] = lt
        self.templates[lt.key] = ir.Template(span=irspan(e.span), name=lt.key, source=lt.source, path=lt.path, variables=lt.variables)
        return lt.key
