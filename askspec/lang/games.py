"""Checks one game (turn protocol) and lowers it to IR steps.

Besides names and types this pass owns the protocol-level checks: template variables at
each ask, loop bounds (E401), reward coverage of trained roles on every path (E402),
roles asked before any model is bound (E403), unreachable statements (W502), and the
static per-session upper bound on model calls per role. It also checks definite assignment
(E409): a variable read by a step, a reward or a template has a value on every path that
reaches the read, and metrics learn which variables a finished session may lack."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from ..ir import model as ir
from ..ir.vocab import CONTEST_ROUTES, SAMPLING_FIELDS
from ..ir.walk import bodies
from . import ast as A
from .consts import NotConstant, OutOfRange, const_eval
from .exprs import ExprChecker, Scope, Sym, irspan, name_list, suggest
from .parser import KEYWORDS
from ..span import Span
from .templates import JINJA_GLOBALS, LoadedTemplate, field_location, variable_location
from .types import ANY, NUM, OUTCOME, T, boolish, is_a, list_of, numeric

if TYPE_CHECKING:
    from .checker_base import CheckContext

MAX_STATIC_BOUND = 1_000_000


class GameChecker:
    def __init__(self, c: CheckContext, g: A.GameDecl) -> None:
        self.c = c
        self.g = g
        self.sink = c.sink
        self.outcomes: list[str] = []
        for s in _walk(g.body):
            if isinstance(s, A.Outcomes):
                for name, span in s.names:
                    if name in self.outcomes:
                        self.sink.error("E104", f"outcome '{name}' declared twice", span)
                    else:
                        self.outcomes.append(name)
        self.x = ExprChecker(self.sink, set(self.outcomes))
        self.x.role_reply = c.role_checks.reply_types()
        self.roles = {r.name: r for r in c.exp.roles}
        self.bound_roles: set[str] = set()
        self.asked_roles: set[str] = set()
        self.session_vars: dict[str, T] = {}
        self.group_size = 1
        self.routes: list[ir.Route] = []  # group-level, collected from the body
        self.contest_templates: list[tuple[str, set[str]]] = []  # (template, extra names) of routed contests
        self.overflow_checked: set[str] = set()  # roles checked by check_overflow_outcome
        self.flow = _Flow()  # definite assignment where the walk is (E409)
        self.live = False  # whether the walk is on a path that can run (not after an `end`, not walking)
        self.contest_reads: set[str] = set()  # variables the game's tournament / judge prompts read
        self.ended: list[tuple[dict[str, bool | str | None], str]] = []  # those variables at each `end`, and where

    def err(self, code, msg, span, hint=None):
        self.sink.error(code, msg, span, hint)

    # ---------------------------------------------------------------------------------
    def run(self) -> ir.Game:
        g = self.g
        scope = Scope()
        for p, t in self.c.param_types.items():
            scope.define(p, Sym("param", t, self.c.param_spans.get(p)))
        self.param_syms = dict(scope.names)
        for r in self.roles:
            scope.define(r, Sym("role", T("role", role=r), None, used=True))
        for ds in self.c.exp.datasets:
            scope.define(ds.name, Sym("data", list_of(self.c.block_checks.data_item_type(ds.name)), None))
        for b in self.c.exp.buffers:
            scope.define(b.name, Sym("buffer", list_of(self.c.block_checks.data_item_type(b.name)), None))
        self.data_syms = {n: s for n, s in scope.names.items() if s.kind in ("data", "buffer")}
        game = ir.Game(span=irspan(g.span), name=g.name, outcomes=list(self.outcomes), body=[])
        if g.iter is not None:
            it, itype = self.x.check(g.iter, scope)
            self._mark_used(g.iter)
            game.iter = it
            game.pattern = [n for n, _ in g.pattern]
            elem = self._iter_elem(itype, g.iter)
            self._bind_pattern(g.pattern, elem, scope)
        if g.times is not None:
            game.times = self.c.const_int(g.times, "times", 1) or 1
            self._mark_used(g.times)
        if g.sample is not None:
            game.group_size = self.c.const_int(g.sample, "the group size (sample)", 1) or 1
            self._mark_used(g.sample)
        self.group_size = game.group_size
        game_scope = scope.child()
        self.game_scope = game_scope
        if self.outcomes:
            game_scope.define("outcome", Sym("var", OUTCOME, None, used=True))
        self.contest_reads = self._contest_reads()
        self.flow, self.live = _Flow(), True
        self.x.on_var_read = self.read_var
        game.body = self.block(g.body, game_scope, in_loop=False)
        self.c.session_unassigned[g.name] = dict(self.flow.why) if self.live else {}
        # tournament / judge prompts see the group's session variables (at the session's
        # end, however it ended), the traces being judged, and the parameters
        ends = [(self.flow.status(self.contest_reads), "when the session reaches the end of the game")] if self.live else []
        ends += [(at_end, f"when the session ends at {where}") for at_end, where in self.ended]
        self.flow, self.live = _Flow(), bool(ends)
        self.flow.meet(ends)
        for key, extra in self.contest_templates:
            self.check_template_vars(key, _Available(game_scope, extra), game_scope)
        self.live = False
        self.x.on_var_read = None
        game.routes = self.routes
        self.flow_check(g)
        game.call_bounds = self.call_bounds(game.body)
        for r in self.asked_roles:
            self.c.used.add(("role", r))
        for name, sym in game_scope.names.items():
            # `any`: a value whose type is unknown (an open record's field, or a type left
            # unknown after a reported type error) may be a scalar at run time; metrics see it
            if sym.type.name in ("number", "bool", "string", "outcome", "any"):
                self.session_vars[name] = sym.type
        for name in game.pattern:
            item = scope.lookup(name)
            if item is not None:
                self.session_vars[name] = item.type
        self.c.session_vars[g.name] = self.session_vars
        for name, sym in self.param_syms.items():
            if sym.used:
                self.c.used.add(("param", name))
        for name, sym in self.data_syms.items():
            if sym.used:
                self.c.used.add((sym.kind if sym.kind == "buffer" else "data", name))
        return game

    def _mark_used(self, e: A.Expr) -> None:
        for n in A.names_in(e):
            if n in self.param_syms:
                self.param_syms[n].used = True

    def _iter_elem(self, t: T, e: A.Expr) -> T:
        if isinstance(e, A.Name) and e.id in self.data_syms:
            return self.c.block_checks.data_item_type(e.id)
        if t.name == "list":
            return t.elem or ANY
        if t.name != "any":
            self.err("E201", f"a game iterates over a list or data set, found {t}", e.span)
        return ANY

    def _bind_pattern(self, pattern: list[tuple[str, Span]], elem: T, scope: Scope) -> None:
        if len(pattern) == 1:
            name, span = pattern[0]
            scope.define(name, Sym("var", elem, span, used=True))
            return
        inner = elem.elem if elem.name == "list" and elem.elem else ANY
        if elem.name not in ("list", "any"):
            self.err("E201", f"cannot unpack {elem} into {len(pattern)} names", pattern[0][1])
        for name, span in pattern:
            scope.define(name, Sym("var", inner, span, used=True))

    # ---------------------------------------------------------------------------------
    def block(self, stmts: list, scope: Scope, in_loop: bool) -> list:
        out = []
        ended = False
        for s in stmts:
            if ended and not isinstance(s, A.Outcomes):
                self.sink.warn("W502", "unreachable statement: the session has already ended", s.span)
                ended = False  # warn once per block
            step = self.stmt(s, scope, in_loop)
            if isinstance(s, A.End):
                ended = True
                if self.live:
                    self.ended.append((self.flow.status(self.contest_reads), _at(s.span)))
                self.live = False  # nothing after an `end` runs
            if step is not None:
                out.append(step)
        return out

    def stmt(self, s, scope: Scope, in_loop: bool):
        return self.STMT_CHECKS[type(s)](self, s, scope, in_loop)

    def _Outcomes(self, s, scope, in_loop):
        return None

    def expr(self, e: A.Expr, scope: Scope) -> tuple[ir.Expr, T]:
        return self.x.check(e, scope)

    def define(self, scope: Scope, name: str, t: T, span: Span) -> None:
        if name in self.roles:
            self.err("E104", f"'{name}' is a role; choose another variable name", span)
            return
        sym = scope.lookup(name)
        if sym is not None and sym.kind == "param":
            self.err("E104", f"'{name}' is a parameter; parameters cannot be reassigned", span)
            return
        if name == "outcome":
            return
        existing = self.game_scope.names.get(name)
        if existing is not None and existing.type != t and existing.type.name != "any":
            t = _widen(existing.type, t)
        # variables live for the whole session, like Python function locals
        self.game_scope.define(name, Sym("var", t, span, used=True))
        self.assigned(name)

    # -- definite assignment (E409) ----------------------------------------------------
    def assigned(self, *names: str) -> None:
        if self.live:
            for name in names:
                self.flow.assign(name)

    def _contest_reads(self) -> set[str]:
        """The variables the tournament / judge prompts of this game's routes read (unguarded)."""
        out: set[str] = set()
        for s in _walk(self.g.body):
            for arm in s.arms if isinstance(s, A.Route) else []:
                if arm.target in CONTEST_ROUTES and arm.arg is not None:
                    pool = self.c.exp.tournaments if arm.target == "tournament" else self.c.exp.judges
                    for contest in pool:
                        lt = self.c.loaded.get(contest.template) if contest.name == arm.arg[0] else None
                        if lt is not None:
                            out |= set(lt.variables) - lt.guarded
        return out

    def read_var(self, name: str, sym: Sym, span: Span | Callable[[], Span], ask: Span | None = None) -> None:
        """A read of `name` (resolved to `sym`) where the walk is: E409 when it is a session
        variable that some path reaching here leaves unassigned (the session would fail there
        with "'name' has no value yet on this path")."""
        if not self.live or name in self.flow.assigned or self.game_scope.names.get(name) is not sym:
            return  # unreachable, assigned, or not a session variable (a parameter, a loop's or the pattern's name)
        why = self.flow.why.get(name)
        where = span() if callable(span) else span
        if why is None:
            first = "no `outcome = ...`" if name == "outcome" else "no assignment to it"
            d = self.sink.error("E409", f"'{name}' has no value here: {first} runs before this on any path", where,
                                f"assign '{name}' before this read")
        else:
            d = self.sink.error("E409", f"'{name}' may have no value here: it is unassigned {why}", where,
                                f"assign '{name}' on every path to this read (in each branch, or before the `if` or loop)")
        if ask is not None and ask != where:
            d.notes.append(("the template is rendered by this ask", ask))

    def _Assign(self, s: A.Assign, scope, in_loop):
        if isinstance(s.value, A.Ask):
            return self.ask(s.value, s.targets, scope)
        if len(s.targets) != 1:
            self.err("E109", "several names on the left need an 'ask' of as many roles on the right", s.span)
            return None
        name, span = s.targets[0]
        value, t = self.expr(s.value, scope)
        if name == "outcome":
            if not self.outcomes:
                self.err("E203", "this game declares no outcomes", span, "declare them: outcomes calibrated, too_easy, too_hard")
            elif t.name not in ("outcome", "any"):
                self.err("E201", f"outcome must be one of {', '.join(self.outcomes)}, found {t}", s.value.span)
            self.assigned("outcome")
            return ir.OutcomeStep(span=irspan(s.span), value=value)
        self.define(scope, name, t, span)
        return ir.AssignStep(span=irspan(s.span), name=name, value=value)

    def _AskStmt(self, s: A.AskStmt, scope, in_loop):
        return self.ask(s.ask, [], scope)

    def ask(self, a: A.Ask, targets: list[tuple[str, Span]], scope: Scope) -> ir.AskStep | None:
        roles = []
        for name, span in a.roles:
            if name not in self.roles:
                self.err("E102", f"unknown role '{name}'", span, suggest(name, self.roles))
            else:
                roles.append(name)
                self.asked_roles.add(name)
                if self.roles[name].model is None and name not in self.bound_roles:
                    self.err("E403", f"role '{name}' has no model here", span,
                             f"give it one (model = ...) or bind it first: bind {name} = \"model-name\"")
        if targets and len(targets) != len(a.roles):
            self.err("E109", f"{len(targets)} names receive the replies of {len(a.roles)} role(s)", a.span)
        sample_n = None
        sample_ir = None
        if a.sample is not None:
            sample_ir, st = self.expr(a.sample, scope)
            if not numeric(st):
                self.err("E201", f"sample needs a number, found {st}", a.sample.span)
            try:
                v = const_eval(a.sample, self.c.params)
            except OutOfRange as nc:
                self.err("E006", f"a sample count: {nc.why}", nc.node.span)
            except NotConstant:
                self.err("E401", "sample needs a count known before the run (a number or parameter)", a.sample.span)
            else:
                self._mark_used(a.sample)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= MAX_STATIC_BOUND:
                    self.err("E107", f"a sample count must be a whole number between 1 and {MAX_STATIC_BOUND}, found {v!r}",
                             a.sample.span)
                else:
                    sample_n = int(v)
        message = context = None
        extra: set[str] = set()
        if a.message is not None:
            message, mt = self.expr(a.message, scope)
            extra.add("message")
        if a.with_ is not None:
            context, wt = self.expr(a.with_, scope)
            if wt.name == "record" and wt.fields is not None:
                extra |= {k for k, _ in wt.fields}
            elif wt.name != "any":
                self.err("E201", f"'with' takes a record, e.g. with {{round: r}}, found {wt}", a.with_.span)
        template = None
        if a.using is not None:
            template = self.c.template(a.using)
        for role in roles:
            r = self.roles[role]
            self.check_overflow_outcome(r, a.span)
            tpl = template or r.prompt
            if tpl is None and message is None:
                self.err("E106", f"nothing to send to '{role}': give a template (using ...), a message (: expr) or a role prompt", a.span)
            names = _Available(scope, extra | {"role", "turn"})
            for key in {k for k in (tpl, r.system) if k is not None}:
                self.check_template_vars(key, names, scope, a.span)
            if r.recover.retries:
                for key in {k for k in (r.recover.truncated, r.recover.malformed) if k is not None}:
                    self.check_template_vars(key, _Available(scope, names.extra | {"reply", "missing"}), scope, a.span)
        step = ir.AskStep(span=irspan(a.span), roles=roles, targets=[n for n, _ in targets] or [None] * len(roles),
                          sample=sample_ir, template=template, message=message, context=context,
                          sampling=self.ask_sampling(a.sampling or []),
                          role_sampling=self.ask_role_sampling(a, roles))
        if sample_n is not None and a.sample is not None:
            step.sample = ir.Lit(value=sample_n, type="number", span=irspan(a.sample.span))
        for (name, span), role in zip(targets, roles):
            t = self.x.role_reply.get(role, ANY)
            self.define(scope, name, list_of(t) if a.sample is not None else t, span)
        self.assigned(*(n for n, _ in targets))  # all of them, so an unknown role (E102) is not also E409
        return step

    def check_overflow_outcome(self, r: ir.Role, span: Span) -> None:
        """E203: a role whose long prompt ends the session (`prompt_overflow = end(OUTCOME)`)
        is asked in a game that does not declare OUTCOME (once per game and role)."""
        over = r.prompt_overflow
        if over is None or over.outcome is None or over.outcome in self.outcomes or r.name in self.overflow_checked:
            return
        self.overflow_checked.add(r.name)
        self.err("E203", f"role '{r.name}' ends a session whose prompt is over its max_prompt_tokens with outcome "
                 f"'{over.outcome}', which game '{self.g.name}' does not declare", span,
                 f"declare it: outcomes {', '.join([*self.outcomes, over.outcome])}")

    def ask_role_sampling(self, a: A.Ask, roles: list[str]) -> dict[str, dict[str, int | float | list[str]]] | None:
        """`with sampling { ROLE { ... } }`: each section names one of this ask's roles (E102
        for an undeclared role or one this ask does not ask, E104 for a role given twice)."""
        out: dict[str, dict[str, int | float | list[str]]] = {}
        for rs in a.role_sampling or []:
            if rs.role not in roles:
                if rs.role in self.roles:
                    self.err("E102", f"role '{rs.role}' is not asked here, so it takes no sampling fields of its own",
                             rs.role_span, f"this ask asks {', '.join(n for n, _ in a.roles)}")
                elif not any(rs.role == n for n, _ in a.roles):  # an unknown asked role is reported once, at the ask
                    self.err("E102", f"unknown role '{rs.role}'", rs.role_span,
                             suggest(rs.role, [n for n, _ in a.roles]) or f"this ask asks {', '.join(n for n, _ in a.roles)}")
                self.ask_sampling(rs.attrs, f"role '{rs.role}' in this ask")  # its fields are still checked
                continue
            if rs.role in out:
                self.err("E104", f"role '{rs.role}' has sampling fields of its own twice in this ask", rs.role_span)
                continue
            out[rs.role] = self.ask_sampling(rs.attrs, f"role '{rs.role}' in this ask")
        return out or None

    def ask_sampling(self, attrs: list[A.Attribute], where: str = "this ask") -> dict[str, int | float | list[str]]:
        """`with sampling { ... }`: the vocabulary's sampling fields, constants checked as a
        model's or role's are (E105 for an unknown field, E201 / E107 for a bad value)."""
        out: dict[str, int | float | list[str]] = {}
        for a in attrs:
            if a.name not in SAMPLING_FIELDS:
                own = a.name in self.roles and f"a role's own fields are a block: {a.name} {{ max_tokens = 8192 }}"
                self.err("E105", f"unknown sampling field '{a.name}'", a.name_span,
                         own or suggest(a.name, SAMPLING_FIELDS) or f"sampling fields: {', '.join(SAMPLING_FIELDS)}")
                continue
            if a.name in out:
                self.err("E104", f"sampling field '{a.name}' is set twice in {where}", a.name_span)
                continue
            self._mark_used(a.value)
            v = self.c.role_checks.sampling_value(a.name, a.value)
            if v is not None:
                out[a.name] = v
        return out

    def check_template_vars(self, key: str, available: "_Available", scope: Scope, at: Span | None = None) -> None:
        """E301 for a variable the template uses that is not available; E409 for one that a
        path to `at` (the ask rendering it; None: the session's end) leaves unassigned."""
        lt = self.c.loaded.get(key)
        if lt is None:
            return
        for var in lt.variables:
            if var in JINJA_GLOBALS:
                continue
            if var in available:
                sym = scope.lookup(var)
                if sym is not None:
                    sym.used = True
                    if var not in available.extra and var not in lt.guarded:  # `with` fields shadow variables
                        self.read_var(var, sym, functools.partial(variable_location, lt, var), at)
                if var in self.param_syms:
                    self.param_syms[var].used = True
                continue
            span = variable_location(lt, var)
            self.err("E301", f"template uses '{var}', which the protocol does not provide here", span,
                     suggest(var, available.names) or _available(available.names))
        for var, path, lineno in lt.fields:
            sym = scope.lookup(var) if var in available and var not in available.extra else None
            if sym is not None:
                self.check_template_fields(lt, var, sym.type, path, lineno)

    def check_template_fields(self, lt: LoadedTemplate, var: str, t: T, path: tuple[str, ...], lineno: int) -> None:
        """A template's ``var.a.b`` typed like the spec's own ``var.a.b`` (E202 with a
        "did you mean"), as far as the types are known: an open record, a list or `any`
        ends the check, and so does what the value itself has at run time (a record is a
        dict there: ``item.items()``; a string has its methods: ``r.text.strip()``)."""
        for at, name in enumerate(path):
            if t.name == "record" and t.fields is not None:
                ft = t.field(name)
                if ft is not None:
                    t = ft
                    continue
                if name.startswith("_") or hasattr(dict, name):
                    return  # the engine's own keys (`_turn`) and dict methods; E305 judges dunders
            elif t.name not in _SCALAR_SAMPLES or any(hasattr(v, name) for v in _SCALAR_SAMPLES[t.name]):
                return
            self.x.attr_type(t, name, field_location(lt, lineno, var, path, at))
            return

    def _bound(self, e: A.Expr, what: str) -> int | None:
        try:
            v = const_eval(e, self.c.params)
        except OutOfRange as nc:
            self.err("E006", f"{what}: {nc.why}", nc.node.span)
            return 0
        except NotConstant:
            return None
        self._mark_used(e)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0 or v > MAX_STATIC_BOUND:
            self.err("E107", f"{what} must be a whole number between 0 and {MAX_STATIC_BOUND}, found {v!r}", e.span)
            return 0
        return int(v)

    def _Repeat(self, s: A.Repeat, scope, in_loop):
        start_ir: ir.Expr = ir.Lit(value=1, type="number")
        if s.start is not None:
            start_ir, st = self.expr(s.start, scope)
            if not numeric(st):
                self.err("E201", f"a range bound must be a number, found {st}", s.start.span)
        stop_ir, tt = self.expr(s.stop, scope)
        if not numeric(tt):
            self.err("E201", f"a repeat count must be a number, found {tt}", s.stop.span)
        hi = self._bound(s.stop, "a repeat bound")
        lo = self._bound(s.start, "a repeat bound") if s.start is not None else 1
        if hi is None or lo is None:
            self.err("E401", "repeat needs a bound known before the run (a number or parameter)", s.stop.span if hi is None or s.start is None else s.start.span,
                     "use 'while COND limit N { ... }' for a data-dependent loop")
            bound = 0
        else:
            bound = max(0, hi - lo + 1)
        inner = scope.child()
        before = self.before_loop()
        if s.var is not None:
            inner.define(s.var[0], Sym("var", NUM, s.var[1], used=True))
            self.assigned(s.var[0])
        body = self.block(s.body, inner, True)
        self.after_loop(before, "repeat", s, self._repeat_runs(s))
        return ir.RepeatStep(span=irspan(s.span), var=s.var[0] if s.var else None, start=start_ir, stop=stop_ir, bound=bound, body=body)

    def _While(self, s: A.While, scope, in_loop):
        cond, ct = self.expr(s.cond, scope)
        if not boolish(ct):
            self.err("E201", f"a loop condition must be bool, found {ct}", s.cond.span)
        limit = None
        if s.limit is None:
            kw = "until" if s.until else "while"
            self.err("E401", f"unbounded loop: '{kw}' needs a limit", s.span, f"write '{kw} COND limit N {{ ... }}'")
        else:
            limit = self._bound(s.limit, "a loop limit")
            if limit is None:
                self.err("E401", "a loop limit must be known before the run (a number or parameter)", s.limit.span)
        before = self.before_loop()
        body = self.block(s.body, scope.child(), True)
        self.after_loop(before, "until" if s.until else "while", s, False)
        return ir.WhileStep(span=irspan(s.span), cond=cond, until=s.until, limit=limit or 0, body=body)

    def _For(self, s: A.For, scope, in_loop):
        it, t = self.expr(s.iter, scope)
        if t.name not in ("list", "any"):
            self.err("E201", f"'for' iterates over a list, found {t}", s.iter.span)
        limit = None
        if s.limit is not None:
            limit = self._bound(s.limit, "a loop limit")
            if limit is None:
                self.err("E401", "a loop limit must be known before the run", s.limit.span)
        else:
            try:
                v = const_eval(s.iter, self.c.params)
                limit = len(v) if isinstance(v, list) else None
            except NotConstant:
                limit = self._list_bound(s.iter)
            if limit is None:
                self.err("E401", "unbounded loop: the length of this list is not known before the run", s.iter.span,
                         "add a limit: for x in xs limit N { ... }")
        inner = scope.child()
        elem = t.elem if t.name == "list" and t.elem else ANY
        if len(s.pattern) == 1:
            name, span = s.pattern[0]
            inner.define(name, Sym("var", elem, span, used=True))
        else:
            self._bind_pattern(s.pattern, elem, inner)
        before = self.before_loop()
        self.assigned(*(n for n, _ in s.pattern))
        body = self.block(s.body, inner, True)
        self.after_loop(before, "for", s, self._runs_at_least_once(s))
        return ir.ForStep(span=irspan(s.span), names=[n for n, _ in s.pattern], iter=it, limit=limit or 0, body=body)

    def before_loop(self) -> tuple[bool, int]:
        return self.live, self.flow.mark()

    def after_loop(self, before: tuple[bool, int], kw: str, s: A.Node, runs: bool) -> None:
        """The flow after a loop: its body's, met with the flow before it unless the loop
        certainly runs at least once."""
        live, mark = before
        paths = [(self.flow.delta(mark), f"when the `{kw}` at {_at(s.span)} runs")] if self.live else []
        self.flow.undo(mark)
        if live and not runs:
            paths.append(({}, f"when the `{kw}` at {_at(s.span)} runs no iteration"))
        self.live = live and bool(paths)
        self.flow.meet(paths)

    def _list_bound(self, e: A.Expr) -> int | None:
        """Length bound of a list produced by `sample N ask` (held in a variable), or of a
        data set whose size is known before the run (inline items, or a `limit`)."""
        if isinstance(e, A.Name):
            if e.id in self.sample_sizes:
                return self.sample_sizes[e.id]
            ds = next((d for d in self.c.exp.datasets if d.name == e.id), None)
            if ds is not None:
                limit = ds.options.get("limit")
                if ds.items is not None:
                    return len(ds.items) if not isinstance(limit, int) else min(len(ds.items), limit)
                if isinstance(limit, int) and not isinstance(limit, bool):
                    return limit
        return None

    @functools.cached_property
    def sample_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for s in _walk(self.g.body):
            if isinstance(s, A.Assign) and isinstance(s.value, A.Ask) and s.value.sample is not None:
                try:
                    n = int(const_eval(s.value.sample, self.c.params))
                except (NotConstant, TypeError, ValueError):
                    continue
                for name, _ in s.targets:
                    sizes[name] = max(sizes.get(name, 0), n)
        return sizes

    def _If(self, s: A.If, scope, in_loop):
        branches = []
        at = _at(s.span)
        live = self.live  # whether the next branch can run (not once a branch is decided true)
        mark = self.flow.mark()
        paths: list[tuple[dict[str, bool | str | None], str]] = []  # each live branch's changes, and its path
        for i, (cond, body) in enumerate(s.branches):
            self.live = live
            c, ct = self.expr(cond, scope)
            if not boolish(ct):
                self.err("E201", f"an 'if' condition must be bool, found {ct}", cond.span)
            # a condition on parameters only is decided now (as for E402): the other branches never run
            truth = self._const_truth(cond) if live else None
            self.live = live and truth is not False
            branches.append(ir.Branch(cond=c, body=self.block(body, scope.child(), in_loop)))
            if self.live:
                paths.append((self.flow.delta(mark), f"when the `if` at {at} is true" if i == 0
                              else f"when the `if` at {at} takes its `elif` at {_at(cond.span)}"))
            self.flow.undo(mark)
            if truth is True:
                live = False
        self.live = live
        orelse = self.block(s.orelse, scope.child(), in_loop) if s.orelse is not None else []
        if self.live:
            paths.append((self.flow.delta(mark), f"when the `if` at {at} takes its `else`" if s.orelse is not None
                          else f"when the `if` at {at} is false" if len(s.branches) == 1
                          else f"when the `if` at {at} takes none of its branches"))
        self.flow.undo(mark)
        self.live = bool(paths)
        self.flow.meet(paths)
        return ir.IfStep(span=irspan(s.span), branches=branches, orelse=orelse)

    def _Reward(self, s: A.Reward, scope, in_loop):
        value, t = self.expr(s.value, scope)
        if not numeric(t):
            self.err("E201", f"a reward must be a number, found {t}", s.value.span)
        name = s.name or "reward"
        if s.target in self.roles:
            return ir.RewardStep(span=irspan(s.span), role=s.target, name=name, value=value)
        sym = scope.lookup(s.target)
        if sym is not None and sym.type.name == "record" and sym.type.role:
            self.read_var(s.target, sym, s.target_span)  # the reply the reward is attached to
            return ir.RewardStep(span=irspan(s.span), role=sym.type.role, turn_var=s.target, name=name, value=value)
        return self._not_a_target(s, scope, sym, "a role or a single reply")

    def _not_a_target(self, s, scope, sym, wanted: str) -> None:
        """`reward`/`drop` named something that is not what they take (or nothing at all)."""
        if sym is not None:
            self.err("E201", f"'{s.target}' is not {wanted} (it is {sym.type})", s.target_span)
        else:
            self.err("E102", f"unknown role '{s.target}'", s.target_span, suggest(s.target, lambda: set(self.roles) | scope.all_names()))
        return None

    def _Bind(self, s: A.Bind, scope, in_loop):
        if s.role not in self.roles:
            self.err("E102", f"unknown role '{s.role}'", s.role_span, suggest(s.role, self.roles))
            return None
        value, t = self.expr(s.value, scope)
        if t.name not in ("string", "any"):
            self.err("E201", f"bind takes a model name (string), found {t}", s.value.span)
        self.bound_roles.add(s.role)
        return ir.BindStep(span=irspan(s.span), role=s.role, model=value)

    def _Drop(self, s: A.Drop, scope, in_loop):
        if s.target in KEYWORDS:  # `drop` with its target missing swallowed the next keyword
            self.err("E001", f"'drop' needs a role or a reply variable, found the keyword '{s.target}'", s.target_span)
            return None
        if s.target in self.roles:
            return ir.DropStep(span=irspan(s.span), role=s.target)
        sym = scope.lookup(s.target)
        t = sym.type if sym is not None else None
        if t is not None and t.name == "list" and t.elem is not None:
            t = t.elem
        if t is not None and t.name == "record" and t.role:
            sym.used = True
            return ir.DropStep(span=irspan(s.span), role=t.role, turn_var=s.target)
        return self._not_a_target(s, scope, sym, "a role, a reply or a list of replies")

    def _Push(self, s: A.Push, scope, in_loop):
        value, t = self.expr(s.value, scope)
        buf = next((b for b in self.c.exp.buffers if b.name == s.buffer), None)
        if buf is None:
            self.err("E110", f"unknown buffer '{s.buffer}'", s.buffer_span, suggest(s.buffer, lambda: [b.name for b in self.c.exp.buffers]))
            return None
        self.c.used.add(("buffer", s.buffer))
        if t.name not in ("record", "any"):
            self.err("E201", f"push takes a record, e.g. push {s.buffer}: {{question: q, answer: a}}, found {t}", s.value.span)
        elif t.fields is not None and buf.fields:
            want = self.c.block_checks.data_item_type(buf.name)
            have = dict(t.fields)
            for k, ft in want.fields or ():
                if k not in have:
                    self.err("E202", f"buffer '{buf.name}' items need field '{k}'", s.value.span)
                elif not is_a(have[k], ft):
                    self.err("E201", f"field '{k}' of buffer '{buf.name}' is {ft}, found {have[k]}", s.value.span)
            for k in have:
                if k not in buf.fields:
                    self.err("E202", f"buffer '{buf.name}' has no field '{k}'", s.value.span,
                             suggest(k, buf.fields) or f"fields: {', '.join(buf.fields)}")
        return ir.PushStep(span=irspan(s.span), buffer=s.buffer, value=value)

    def _End(self, s: A.End, scope, in_loop):
        outcome = None
        if s.outcome is not None:
            outcome = s.outcome[0]
            if outcome not in self.outcomes:
                self.err("E203", f"unknown outcome '{outcome}'", s.outcome[1],
                         suggest(outcome, self.outcomes) or f"declared outcomes: {', '.join(self.outcomes) or 'none'}")
        return ir.EndStep(span=irspan(s.span), outcome=outcome)

    def _Route(self, s: A.Route, scope, in_loop):
        if in_loop:
            self.err("E404", "route is group-level: put it at the top of the game, not in a loop", s.span)
        if self.group_size <= 1:
            self.err("E404", "route needs groups: give the game a 'sample N' (N ≥ 2)", s.span)
        if s.role not in self.roles:
            self.err("E102", f"unknown role '{s.role}'", s.role_span, suggest(s.role, self.roles))
        gscope = Scope()
        for p, sym in self.param_syms.items():
            gscope.define(p, sym)
        gscope.define("rewards", Sym("var", list_of(NUM), None, used=True))
        gscope.define("size", Sym("var", NUM, None, used=True))
        arms = []
        saw_else = False
        for arm in s.arms:
            cond = None
            if arm.cond is not None:
                if saw_else:
                    self.sink.warn("W502", "route arm after 'else' is never taken", arm.span)
                cond, ct = self.x.check(arm.cond, gscope)
                if not boolish(ct):
                    self.err("E201", f"a route condition must be bool, found {ct}", arm.cond.span)
            else:
                saw_else = True
            action = arm.target
            target, target_span = arm.arg if arm.arg else (None, arm.target_span)
            if action in ("keep", "drop", "resample"):
                if target:
                    self.err("E107", f"'{action}' takes no name", target_span)
            elif action in CONTEST_ROUTES:
                pool = self.c.exp.tournaments if action == "tournament" else self.c.exp.judges
                if target is None:
                    self.err("E107", f"'{action}' needs the name of a declared {action}", arm.target_span)
                elif not any(x.name == target for x in pool):
                    self.err("E110", f"unknown {action} '{target}'", target_span, suggest(target, lambda: [x.name for x in pool]))
                else:
                    self.c.used.add(("contest", target))
                    contest = next(x for x in pool if x.name == target)
                    extra = {"response_a", "response_b"} if action == "tournament" else {"response"}
                    self.contest_templates.append((contest.template, extra | {"role", "rewards", "size"}))
            else:
                self.err("E107", f"unknown route action '{action}'", arm.target_span, "actions: keep, drop, resample, tournament NAME, judge NAME")
                continue
            match action:  # narrowed to the IR's literal type (others were reported above)
                case "keep" | "drop" | "resample" | "tournament" | "judge":
                    arms.append(ir.RouteArm(span=irspan(arm.span), cond=cond, action=action, target=target))
        if any(r.role == s.role for r in self.routes):
            self.err("E104", f"role '{s.role}' already has a route in this game", s.role_span)
        self.routes.append(ir.Route(span=irspan(s.span), role=s.role, arms=arms))
        return None

    # ---------------------------------------------------------------------------------
    def _const_truth(self, e: A.Expr) -> bool | None:
        """The value of a condition made of parameters and constants, else None."""
        from .consts import NotConstant, OutOfRange, const_eval

        try:
            if isinstance(e, A.Binary) and e.op in ("==", "!="):
                left, right = const_eval(e.left, self.c.params), const_eval(e.right, self.c.params)
                return (left == right) == (e.op == "==")
            v = const_eval(e, self.c.params)
        except (NotConstant, OutOfRange):
            return None
        return v if isinstance(v, bool) else None

    def flow_check(self, g: A.GameDecl) -> None:
        """E402: on every path through the session, each trained role asked on that path
        gets a reward (terminal or per-turn) or is explicitly dropped.

        The walk carries, per path, the trained roles asked but not yet covered (`pending`)
        and the roles already covered (`covered`); branches merge pending by union and
        covered by intersection. A loop that may run zero times merges with the state
        before it."""
        # the nested schedule's grounded outer reward is the schedule's, not the game's
        trained = {r for r in self.asked_roles if self.roles[r].trained and r not in self.c.schedule_rewarded}
        if g.name in self.c.sample_games:  # a retrain stage's sampled items: replies as data, not trained on
            return
        if not trained:
            return
        routed = {r.role for r in self.routes}
        reported: set[tuple[str, Span]] = set()
        reply_role: dict[str, str] = {}
        State = tuple[frozenset, frozenset]  # (pending, covered)

        def report(missing, span: Span, where: str) -> None:
            for role in sorted(missing):
                if (role, span) not in reported:
                    reported.add((role, span))
                    self.err("E402", f"trained role '{role}' gets no reward on a path that {where}", span,
                             f"add 'reward {role} = ...' (or 'drop {role}') on this path")

        def merge(states: list[State | None]) -> State | None:
            live = [x for x in states if x is not None]
            if not live:
                return None
            return frozenset().union(*(p for p, _ in live)), frozenset.intersection(*(c for _, c in live))

        def cover(role: str | None, st: State) -> State:
            if role is None:
                return st
            return st[0] - {role}, st[1] | {role}

        def run(stmts, st: State | None) -> State | None:
            for s in stmts:
                if st is None:
                    return None
                if isinstance(s, (A.Reward, A.Drop)):  # a drop is an explicit "no training signal"
                    st = cover(s.target if s.target in self.roles else reply_role.get(s.target), st)
                elif isinstance(s, (A.AskStmt, A.Assign)) and isinstance(ask := s.ask if isinstance(s, A.AskStmt) else s.value, A.Ask):
                    asked = {r for r, _ in ask.roles if r in trained and r not in st[1]}
                    st = (st[0] | asked, st[1])
                    if isinstance(s, A.Assign):
                        for (n, _), (r, _) in zip(s.targets, ask.roles):
                            reply_role[n] = r
                elif isinstance(s, A.End):
                    report(st[0] - routed, s.span, "ends here")
                    return None
                elif isinstance(s, A.If):
                    # a condition on parameters only is decided now (SOAR's reward variant)
                    outs, decided = [], False
                    for cond, b in s.branches:
                        truth = self._const_truth(cond)
                        if truth is False:
                            continue
                        outs.append(run(b, st))
                        if truth is True:
                            decided = True
                            break
                    if not decided:
                        outs.append(run(s.orelse, st) if s.orelse is not None else st)
                    st = merge(outs)
                elif isinstance(s, A.Repeat):
                    body = run(s.body, st)
                    st = body if self._repeat_runs(s) else merge([st, body])
                elif isinstance(s, (A.While, A.For)):
                    for_item = s.pattern[0][0] if isinstance(s, A.For) and len(s.pattern) == 1 else None
                    if for_item and isinstance(s, A.For) and isinstance(s.iter, A.Name) and s.iter.id in reply_role:
                        reply_role[for_item] = reply_role[s.iter.id]
                    body = run(s.body, st)
                    st = body if isinstance(s, A.For) and self._runs_at_least_once(s) else merge([st, body])
            return st

        final = run(g.body, (frozenset(), frozenset()))
        if final is not None:
            report(final[0] - routed, g.name_span, "reaches the end of the game")

    def _repeat_runs(self, s: A.Repeat) -> bool:
        try:
            lo = const_eval(s.start, self.c.params) if s.start is not None else 1
            hi = const_eval(s.stop, self.c.params)
            return hi - lo + 1 >= 1
        except (NotConstant, TypeError):
            return False

    def _runs_at_least_once(self, s: A.For) -> bool:
        """A `for` over a non-empty constant list or over the replies of `sample N ask`."""
        if isinstance(s.iter, A.Name) and self.sample_sizes.get(s.iter.id, 0) >= 1:
            return True
        try:
            v = const_eval(s.iter, self.c.params)
        except NotConstant:
            return False
        return isinstance(v, list) and len(v) > 0

    def call_bounds(self, steps: list) -> dict[str, int]:
        bounds: dict[str, int] = {}

        def add(d: dict[str, int], role: str, n: int) -> None:
            d[role] = d.get(role, 0) + n

        def walk(steps, mult: int) -> dict[str, int]:
            out: dict[str, int] = {}
            for s in steps:
                if isinstance(s, ir.AskStep):
                    n = s.sample.value if isinstance(s.sample, ir.Lit) and isinstance(s.sample.value, int) else 1
                    for role in s.roles:
                        r = self.roles[role]
                        per_call = 1 + r.recover.retries
                        if r.reply.kind == "json":
                            per_call = max(per_call, 1 + (r.reply.args.get("retries") or 0))
                        add(out, role, mult * n * per_call)
                elif isinstance(s, ir.IfStep):  # one branch runs: the most calls of any
                    best: dict[str, int] = {}
                    for _, body in bodies(s):
                        for k, v in walk(body, mult).items():
                            best[k] = max(best.get(k, 0), v)
                    for k, v in best.items():
                        add(out, k, v)
                else:
                    for times, body in bodies(s):
                        for k, v in walk(body, mult * times).items():
                            add(out, k, v)
            return out

        bounds = walk(steps, 1)
        return dict(sorted(bounds.items()))

    # the handler of each node class (one table: a missing handler is a KeyError here, not an attribute lookup)
    STMT_CHECKS = {
        A.Outcomes: _Outcomes,
        A.Assign: _Assign,
        A.AskStmt: _AskStmt,
        A.Repeat: _Repeat,
        A.While: _While,
        A.For: _For,
        A.If: _If,
        A.Reward: _Reward,
        A.Bind: _Bind,
        A.Drop: _Drop,
        A.Push: _Push,
        A.End: _End,
        A.Route: _Route,
    }


class _Flow:
    """Definite assignment at the walk's point (E409): the session variables assigned on
    every path that reaches it, and, for each variable assigned on some of those paths
    only, a path that leaves it unassigned ("when the `if` at 7:5 is false").

    One mutable state with an undo log, so that a game is checked in time linear in its
    size: each branch of an `if` (or a loop's body) is walked from the state before it,
    its changes taken (`delta`) and undone; where the paths meet, only the variables they
    changed are looked at (`meet`)."""

    def __init__(self) -> None:
        self.assigned: set[str] = set()
        self.why: dict[str, str] = {}
        self._log: list[tuple[str, bool, str | None]] = []  # (name, was assigned, its former reason)

    def assign(self, name: str) -> None:
        if name not in self.assigned:
            self._log.append((name, False, self.why.pop(name, None)))
            self.assigned.add(name)

    def unassigned_when(self, name: str, why: str) -> None:
        self._log.append((name, name in self.assigned, self.why.get(name)))
        self.assigned.discard(name)
        self.why[name] = why

    def mark(self) -> int:
        return len(self._log)

    def _state(self, name: str) -> bool | str | None:
        """True: assigned; else the reason it may not be (None: no path assigned it)."""
        return True if name in self.assigned else self.why.get(name)

    def delta(self, mark: int) -> dict[str, bool | str | None]:
        """The variables changed since `mark`, with their state now."""
        return {name: self._state(name) for name, _, _ in self._log[mark:]}

    def status(self, names: set[str]) -> dict[str, bool | str | None]:
        return {name: self._state(name) for name in names}

    def undo(self, mark: int) -> None:
        while len(self._log) > mark:
            name, was, why = self._log.pop()
            if was:
                self.assigned.add(name)
            else:
                self.assigned.discard(name)
            if why is None:
                self.why.pop(name, None)
            else:
                self.why[name] = why

    def meet(self, paths: list[tuple[dict[str, bool | str | None], str]]) -> None:
        """Where paths from this state meet (the branches of an `if`; a loop's body and its
        skipping): each path's changes and how to say that it is taken. A variable is
        assigned if every path assigns it; otherwise the first path that does not gives the
        reason, its own if the variable was already unassigned on part of that path."""
        for name in dict.fromkeys(n for changes, _ in paths for n in changes):
            states = [(changes.get(name, self.why.get(name)), path) for changes, path in paths]
            if all(state is True for state, _ in states):
                self.assign(name)
            else:
                state, path = next((st, p) for st, p in states if st is not True)
                self.unassigned_when(name, state if isinstance(state, str) else path)


def _at(span: Span) -> str:
    return f"{span.line}:{span.col}"


# values of each scalar type at run time: a template may use their attributes (`r.text.strip()`)
_SCALAR_SAMPLES: dict[str, tuple[object, ...]] = {"number": (0, 0.0), "string": ("",), "bool": (False,)}


class _Available:
    """The variables a template may use at one ask: the scope's values plus ``extra``.
    Membership is a scope lookup, so an ask costs the number of variables its templates
    use, not the number of names in scope (which grows with every ask before it)."""

    def __init__(self, scope: Scope, extra: set[str]) -> None:
        self.scope, self.extra = scope, extra

    def __contains__(self, name: str) -> bool:
        if name in self.extra:
            return True
        sym = self.scope.lookup(name)
        return sym is not None and sym.kind not in ("role", "data", "buffer")

    def names(self) -> set[str]:
        """Every name (for a suggestion; gathered only when one is made)."""
        return _value_names(self.scope) | self.extra


def _available(names: Callable[[], set[str]]) -> str | None:
    listed = name_list(lambda: (v for v in names() if not v.startswith("_")))
    return f"available: {listed}" if listed is not None else None


def _value_names(scope: Scope) -> set[str]:
    """Names a template can use: parameters and session/loop variables (not roles, data
    sets or buffers, which are not values)."""
    return {n for n in scope.all_names() if scope.kind_of(n) not in ("role", "data", "buffer")}


def _widen(a: T, b: T) -> T:
    from .types import unify

    return unify(a, b)


def _walk(stmts):
    for s in stmts:
        yield s
        if isinstance(s, (A.Repeat, A.While, A.For)):
            yield from _walk(s.body)
        elif isinstance(s, A.If):
            for _, b in s.branches:
                yield from _walk(b)
            if s.orelse:
                yield from _walk(s.orelse)
