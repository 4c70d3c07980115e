"""The checker's and the parser's dispatch tables (one per site, no `getattr` on a name
prefix): each table holds every handler its class defines and nothing else, the
expression and statement tables cover every node class of the AST's `Expr` and `Stmt`,
the stage table every stage kind of the vocabulary, and no module of askspec/lang looks
a handler up by name."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from askspec.ir.vocab import STAGE_KINDS
from askspec.lang import ast as A
from askspec.lang.blocks import BlockChecks
from askspec.lang.exprs import ExprChecker
from askspec.lang.games import GameChecker
from askspec.lang.parser import _Builder
from askspec.lang.stages import StageChecks

LANG = Path(__file__).resolve().parents[2] / "askspec" / "lang"

TABLES = [
    (_Builder, "DECLS", "d_"), (_Builder, "STMTS", "s_"), (_Builder, "EXPRS", "e_"),
    (BlockChecks, "BLOCKS", "block_"), (StageChecks, "STAGES", "stage_"),
    (ExprChecker, "EXPR_CHECKS", "_"), (GameChecker, "STMT_CHECKS", "_"),
]


@pytest.mark.parametrize(("cls", "table", "prefix"), TABLES, ids=[t for _, t, _ in TABLES])
def test_each_table_holds_every_handler_of_its_class(cls, table, prefix) -> None:
    handlers = {f for name, f in vars(cls).items() if name.startswith(prefix) and callable(f)
                and (prefix != "_" or name[1:2].isupper())}
    assert set(getattr(cls, table).values()) == handlers


def test_the_node_tables_cover_the_ast() -> None:
    assert set(ExprChecker.EXPR_CHECKS) == set(typing.get_args(A.Expr))
    assert set(GameChecker.STMT_CHECKS) == set(typing.get_args(A.Stmt))
    assert set(StageChecks.STAGES) == set(STAGE_KINDS)


def test_no_handler_is_looked_up_by_name() -> None:
    found = [f"{p.name}: {m.group(0)}" for p in sorted(LANG.glob("*.py"))
             for m in re.finditer(r'getattr\(self, *f?"[a-z_]*"? *\+', p.read_text(encoding="utf-8"))]
    assert found == []


def test_the_checker_is_an_ordered_tuple_of_passes_over_one_context() -> None:
    """sqlglot's shape: the compiler runs PASSES in order over one CheckContext; the
    declaration kinds' checks are objects holding only that context (none inherits
    another's), and reach each other through it."""
    from askspec.lang import compiler
    from askspec.lang.checker_base import CheckContext
    from askspec.lang.roles import RoleChecks
    from askspec.lang.training import TrainingChecks

    assert isinstance(compiler.PASSES, tuple) and all(callable(p) for p in compiler.PASSES)
    assert compiler.Compiler.__bases__ == (object,)
    for cls in (RoleChecks, TrainingChecks, BlockChecks, StageChecks):
        assert cls.__bases__ == (object,), cls
    ctx = compiler.Compiler("x.ask", compiler.DiagnosticSink(), compiler.Sources(), {}, {}).ctx
    assert isinstance(ctx, CheckContext)
    checks = (ctx.role_checks, ctx.training_checks, ctx.block_checks, ctx.stage_checks)
    assert all(c.ctx is ctx for c in checks) and set(vars(ctx.block_checks)) == {"ctx"}
