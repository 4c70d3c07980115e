"""Check-time analysis of a template (E305): what the sandbox of ``sandbox.py`` is
certain to refuse when the template renders — loading other templates (``{% include %}``:
the sandbox has no loader), forbidden attributes (``x.__class__``),
calls that would modify data (``xs.append(1)``), constant expressions past the render
limits (``9 ** 99999999``, ``range(10**9)``, ``'x' | center(10**9)``) and nested loops
over constant ranges whose iterations pass the limit. Constants are evaluated with the
sandbox's own checked operations, so check and run agree on every limit.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from jinja2 import nodes

from .sandbox import (
    MAX_ITERATIONS,
    LOOP_GUARD,
    BoundedSandboxedEnvironment,
    TemplateLimitError,
    check_str_method,
    checked_binop,
    lipsum,
    precheck_filter,
    safe_range,
)


_UNSAFE_NAMES = {"gi_frame", "gi_code", "cr_frame", "cr_code", "ag_code", "ag_frame", "mro", "func_globals",
                 "f_globals", "f_locals", "f_back", "tb_frame"}
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault",
             "popitem", "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update"}
# Names whose attributes are Python objects, not data: an underscore attribute on them is
# always refused by the sandbox (on data records `item._id` is a field and allowed).
_OBJECT_NAMES = {"self", "loop", "range", "dict", "lipsum", "cycler", "joiner", "namespace", "caller", "varargs",
                 "kwargs"}
_UNKNOWN = object()


def _forbidden_attribute(base: nodes.Node, attr: Any) -> bool:
    if not isinstance(attr, str):
        return False
    if attr.startswith("__") or attr in _UNSAFE_NAMES:
        return True
    is_object = isinstance(base, (nodes.Const, nodes.List, nodes.Tuple, nodes.Dict, nodes.Call)) or (
        isinstance(base, nodes.Name) and base.name in _OBJECT_NAMES)
    return attr.startswith("_") and is_object


def _static(node: nodes.Node) -> Any:
    """The value of a constant template expression, computed with the checked operations
    (so a limit is reported as the TemplateLimitError it would raise); _UNKNOWN otherwise."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, (nodes.List, nodes.Tuple)):
        items = [_static(x) for x in node.items]
        return _UNKNOWN if any(x is _UNKNOWN for x in items) else items
    if isinstance(node, nodes.Neg):
        v = _static(node.node)
        return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else _UNKNOWN
    if isinstance(node, nodes.BinExpr):
        left, right = _static(node.left), _static(node.right)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        if node.operator in BoundedSandboxedEnvironment.intercepted_binops:
            try:
                return checked_binop(node.operator, left, right)
            except TemplateLimitError:
                raise
            except Exception:  # e.g. 'a' ** 2: fails when rendered, not a limit
                return _UNKNOWN
        try:
            return {"-": lambda: left - right, "/": lambda: left / right, "//": lambda: left // right}[node.operator]()
        except Exception:
            return _UNKNOWN
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and not node.kwargs \
            and node.dyn_args is None and node.dyn_kwargs is None:
        fns: dict[str, Callable[..., Any]] = {"range": safe_range, "lipsum": lipsum}
        fn = fns.get(node.node.name)
        args = [_static(a) for a in node.args]
        if fn is None or any(a is _UNKNOWN for a in args):
            return _UNKNOWN
        try:
            return fn(*args)
        except TemplateLimitError:
            raise
        except Exception:
            return _UNKNOWN
    if isinstance(node, nodes.Filter) and node.name == LOOP_GUARD and node.node is not None:
        return _static(node.node)
    return _UNKNOWN


def _static_or_none(node: nodes.Node) -> Any:
    try:
        v = _static(node)
    except TemplateLimitError:
        return None  # reported where the value is built
    return None if v is _UNKNOWN else v


def _loop_length(node: nodes.Node) -> int | None:
    try:
        v = _static(node)
    except TemplateLimitError:
        return None  # reported where the value is built
    return len(v) if isinstance(v, (range, list, tuple, str)) else None


def static_problems(tree: nodes.Template) -> list[tuple[int, str, str]]:
    """(line, text to point at on that line, message) for what the sandbox is certain to
    refuse when the template renders: E305 at check time."""
    out: list[tuple[int, str, str]] = []
    for load in tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        word = {nodes.Include: "include", nodes.Import: "import", nodes.FromImport: "from",
                nodes.Extends: "extends"}[type(load)]
        out.append((load.lineno, word, f"template uses '{{% {word} %}}': templates cannot load other templates "
                                       "(name each file in the spec with file(...))"))
    for access in tree.find_all((nodes.Getattr, nodes.Getitem)):
        if isinstance(access, nodes.Getattr):
            attr = access.attr
        elif isinstance(access, nodes.Getitem) and isinstance(access.arg, nodes.Const):
            attr = access.arg.value
        else:
            continue
        if _forbidden_attribute(access.node, attr):
            out.append((access.lineno, attr, f"template uses the attribute {attr!r}, which the sandbox forbids"))
    for flt in tree.find_all(nodes.Filter):
        if flt.name == "attr" and flt.args and isinstance(flt.args[0], nodes.Const) \
                and _forbidden_attribute(nodes.Const(None), flt.args[0].value):
            out.append((flt.lineno, str(flt.args[0].value),
                        f"template uses the attribute {flt.args[0].value!r}, which the sandbox forbids"))
    for call in tree.find_all(nodes.Call):
        if isinstance(call.node, nodes.Getattr) and call.node.attr in _MUTATORS:
            out.append((call.lineno, call.node.attr,
                        f"template calls {call.node.attr!r}, which would modify a value: templates cannot change data"))
        elif isinstance(call.node, nodes.Getattr):
            receiver, args = _static_or_none(call.node.node), [_static_or_none(a) for a in call.args]
            if isinstance(receiver, str):
                try:
                    check_str_method(call.node.attr, receiver, tuple(a for a in args if a is not None), {})
                except TemplateLimitError as e:
                    out.append((call.lineno, call.node.attr, f"template would go past the render limits: {e}"))
    for flt in tree.find_all(nodes.Filter):
        if flt.node is None or flt.kwargs or flt.dyn_args or flt.dyn_kwargs:
            continue
        value, args = _static_or_none(flt.node), [_static_or_none(a) for a in flt.args]
        if value is None or None in args:
            continue
        try:
            precheck_filter(flt.name, value, tuple(args), {})
        except TemplateLimitError as e:
            out.append((flt.lineno, flt.name, f"template would go past the render limits: {e}"))
    seen: set[tuple[int, str]] = set()
    for expr in tree.find_all((nodes.BinExpr, nodes.Call)):
        try:
            _static(expr)
        except TemplateLimitError as e:
            if (expr.lineno, str(e)) not in seen:  # an expression around a failing part fails the same way
                seen.add((expr.lineno, str(e)))
                needle = expr.node.name if isinstance(expr, nodes.Call) and isinstance(expr.node, nodes.Name) else (
                    expr.operator if isinstance(expr, nodes.BinExpr) else "")
                out.append((expr.lineno, needle, f"template would go past the render limits: {e}"))
    out += _nested_loop_problems(tree)
    return out


def _nested_loop_problems(tree: nodes.Template) -> list[tuple[int, str, str]]:
    """Loops over constant ranges or lists whose iterations (each loop's length times
    those of the loops around it, summed, as the render counts them) pass MAX_ITERATIONS."""
    out: list[tuple[int, str, str]] = []
    total = 0

    def walk(children: Iterable[nodes.Node], product: int) -> None:
        nonlocal total
        for child in children:
            if out:
                return
            if not isinstance(child, nodes.For):
                walk(child.iter_child_nodes(), product)
                continue
            n = _loop_length(child.iter)
            runs = product * (n if n is not None else 1)
            total += runs if n is not None else 0
            if total > MAX_ITERATIONS:
                out.append((child.lineno, "for", f"template loops would run {total:,} iterations, "
                                                   f"over the limit of {MAX_ITERATIONS:,} per render"))
                return
            walk(child.body, runs)
            walk(child.else_, product)

    walk([tree], 1)
    return out


def _chain(node: nodes.Node) -> tuple[nodes.Name, tuple[str, ...]] | None:
    """The variable and the fields read in order of ``node`` (``r["a"].b``: r, ("a", "b")),
    cut at an index that is not a constant string (``xs[i].x``: "x" is a field of an
    element, which only the run knows); None when no variable starts it."""
    path: list[str] = []
    while isinstance(node, (nodes.Getattr, nodes.Getitem)):
        if isinstance(node, nodes.Getattr):
            path.append(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            path.append(node.arg.value)
        else:
            path = []  # what was read past this index depends on the index's value
        node = node.node
    return (node, tuple(reversed(path))) if isinstance(node, nodes.Name) and path else None


def guarded_names(tree: nodes.Template) -> set[str]:
    """Variables the template guards somewhere: tests with ``is defined`` / ``is undefined``
    or reads through ``| default(...)``. Such a template can render whether or not the
    variable has a value, so the definite-assignment check (E409) leaves it out. Only the
    variable itself guards it: ``x.a | default("")`` still fails when x has no value."""
    guards = [t.node for t in tree.find_all(nodes.Test) if t.name in ("defined", "undefined")]
    guards += [f.node for f in tree.find_all(nodes.Filter) if f.name in ("default", "d") and f.node is not None]
    return {g.name for g in guards if isinstance(g, nodes.Name)}


def field_uses(tree: nodes.Template) -> list[tuple[str, tuple[str, ...], int]]:
    """(name, fields read in order, line) of each access chain on a variable the template
    does not bind itself: ``item.claim`` -> ("item", ("claim",), 1). The checker types
    these against the protocol (E202). Reads the template guards are left out, wherever
    they are: a field tested with ``is defined`` or read through ``| default(...)``."""
    local = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    guarded = {(c[0].name, c[1]) for c in (
        [_chain(t.node) for t in tree.find_all(nodes.Test) if t.name in ("defined", "undefined")]
        + [_chain(f.node) for f in tree.find_all(nodes.Filter) if f.name in ("default", "d") and f.node is not None])
        if c is not None}
    accesses = [a for a in tree.find_all((nodes.Getattr, nodes.Getitem)) if isinstance(a, (nodes.Getattr, nodes.Getitem))]
    inner = {id(a.node) for a in accesses}
    out: list[tuple[str, tuple[str, ...], int]] = []
    for access in accesses:
        if id(access) in inner:
            continue  # part of a longer chain, read with it
        chain = _chain(access)
        if chain is None:
            continue
        name, path = chain[0].name, chain[1]
        if chain[0].ctx != "load" or name in local or any(
                g == name and path[: len(p)] == p for g, p in guarded):
            continue
        out.append((name, path, access.lineno))
    return out
