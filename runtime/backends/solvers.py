"""Reference solvers a spec may name as `python("askspec.runtime.backends.solvers:NAME")`
models (opt-in: nothing uses them unless a spec names one).

`sympy_math` is Ask-E's offline *strong* boundary model (specs/ask_e.ask): a symbolic
calculator that is exact on what it can read (arithmetic with powers, factorials and
binomials, "the remainder when A is divided by B", gcd / lcm, one equation in one
unknown) and cannot read anything else, where it gives no answer. Beside SmolLM2-135M,
which gets multi-digit arithmetic wrong but reads word problems, the pair really differs
in capability, so a calibrated question (exactly one of the two right) means something.
It replies in the boundary format (`#Summary#`, a short summary, `\\boxed{}`)."""

from __future__ import annotations

import re

_NO_ANSWER = "#Summary#\nI could not read a computation in this question, so I give no answer."
_FUNCTIONS = {"binomial", "factorial", "sqrt", "gcd", "lcm", "pi", "mod"}
_MAX_VALUE_DIGITS = 2000  # refuse results larger than this (e.g. 9^9^9): an answer nobody can check


def sympy_math(messages, request) -> str:
    """Answer the last user message's question, or say it cannot."""
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    question = question.split("When you are done, output #Summary#")[0]  # the probing suffix (App. B)
    question = question.split("Output the final solution in")[0]  # the grading suffix
    try:
        found = solve_text(question)
    except Exception:  # a question it cannot parse is a question it cannot answer
        found = None
    if found is None:
        return _NO_ANSWER
    how, value = found
    return f"#Summary#\nI {how} with SymPy and obtained {value}.\n\\boxed{{{value}}}"


def solve_text(question: str) -> tuple[str, str] | None:
    """(how it was solved, the answer as text), or None when it cannot read the question."""
    import sympy

    text = _plain(question)
    m = re.search(r"remainder when (.+?) is divided by (.+?)(?:[?.]|$)", text, re.I)
    if m:
        a, b = _expr(m.group(1)), _expr(m.group(2))
        base, exp = a.as_base_exp() if isinstance(a, sympy.Pow) else (a, sympy.Integer(1))
        if all(x.is_Integer for x in (base, exp, b)) and b != 0:
            return "reduced it modulo the divisor", str(pow(int(base), int(exp), abs(int(b))))
        return None
    m = re.search(r"(gcd|lcm|greatest common divisor|least common multiple) of (\d+) and (\d+)", text, re.I)
    if m:
        f = sympy.gcd if m.group(1).lower() in ("gcd", "greatest common divisor") else sympy.lcm
        return f"computed the {m.group(1)}", str(f(int(m.group(2)), int(m.group(3))))
    m = re.search(r"solve (?:for \w+ )?(?:in )?(.+?=.+?)(?:[?.]\s|[?.]?$)", text, re.I)
    if m:
        left, right = m.group(1).split("=", 1)
        eq = _expr(left) - _expr(right)
        free = sorted(eq.free_symbols, key=str)
        if len(free) != 1:
            return None
        roots = sympy.solve(eq, free[0])
        if len(roots) != 1:
            return None
        return "solved the equation", _show(roots[0])
    m = re.search(r"(?:what is|compute|calculate|evaluate|find)(?: the value of)?\s+(.+?)\s*(?:\?|\.\s|\.?$)", text, re.I)
    if m:
        value = _expr(m.group(1))
        if value.free_symbols or not value.is_number:
            return None
        return "evaluated the expression", _show(sympy.nsimplify(value) if value.is_Float else value)
    return None


def _plain(text: str) -> str:
    """LaTeX-ish math to plain text SymPy can parse."""
    text = text.replace("$", " ").replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    text = re.sub(r"\\frac\{([^{}]+)\}\{([^{}]+)\}", r"((\1)/(\2))", text)
    text = re.sub(r"\\binom\{([^{}]+)\}\{([^{}]+)\}", r"binomial(\1, \2)", text)
    text = text.replace("{", "(").replace("}", ")").replace("\\left", "").replace("\\right", "")
    return re.sub(r"\s+", " ", text).strip()


def _expr(text: str):
    from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application, parse_expr,
                                            standard_transformations)

    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.strip().rstrip(".?"))  # 1,000 -> 1000
    text = text.replace("\\", "")
    if not re.fullmatch(r"[\w\s+\-*/^()!.,]+", text) or len(text) > 200:
        raise ValueError("not a plain computation")
    # parse_expr evaluates Python: only one-letter unknowns and a few functions get through
    if any(len(n) > 1 and n not in _FUNCTIONS for n in re.findall(r"[A-Za-z_]\w*", text)):
        raise ValueError("not a plain computation")
    transformations = standard_transformations + (convert_xor, implicit_multiplication_application)
    raw = parse_expr(text, transformations=transformations, evaluate=False)
    _check_size(raw)
    return parse_expr(text, transformations=transformations, evaluate=True)


def _check_size(raw) -> None:
    """Refuse before evaluating what would be too large to compute (9^9^9, 10^6!): a
    power's exponent and a factorial's argument must be small constants."""
    import sympy

    for node in sympy.preorder_traversal(raw):
        limited = node.exp if isinstance(node, sympy.Pow) else node.args[0] if isinstance(node, sympy.factorial) else None
        if limited is None:
            continue
        if not limited.is_Number or abs(limited) > 5000:
            if isinstance(node, sympy.Pow) and limited.free_symbols:
                continue  # x^2 in an equation, checked when its value is known
            raise ValueError("too large to compute")


def _show(value) -> str:
    import sympy

    value = sympy.nsimplify(value) if getattr(value, "is_Float", False) else value
    if value.is_Integer and len(str(abs(int(value)))) > _MAX_VALUE_DIGITS:
        raise ValueError("too large")
    return sympy.latex(value) if not value.is_Integer else str(int(value))
