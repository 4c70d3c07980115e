"""The runtime's import graph, from the source: every module of `askspec.runtime` is
parsed and every import (module-level, function-level and TYPE_CHECKING alike) is an
edge. The graph has no cycle, and stages only import downwards (docs/architecture.md):

    commands, targets -> train -> engine -> {store, backends, scoring, replies} ;  scoring -> replies

(commands and targets side by side: the local runtime imports nothing of a target), nothing
in the runtime (nor in askspec.lang / askspec.ir) imports the TUI: only the entry point,
askspec/cli.py, wires the `tui` command; the TUI reads runs through the store, not through
the commands; and of askspec.lang the runtime imports only the template sandbox and paths."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"askspec.runtime": ROOT / "runtime", "askspec": ROOT / "askspec"}

# stage -> the stages it must never import
FORBIDDEN = {
    "replies": {"engine", "commands", "store", "backends", "scoring", "targets", "train"},
    "scoring": {"engine", "commands", "store", "backends", "targets", "train"},
    "backends": {"engine", "commands", "store", "scoring", "replies", "targets", "train"},
    "store": {"engine", "commands", "backends", "scoring", "replies", "targets", "train"},
    "engine": {"commands", "targets", "train"},
    "train": {"commands", "targets"},
    # the local runtime (the `askspec run` commands) runs nothing of a target's job
    "commands": {"targets"},
    # compilation targets (runtime/targets) wire the engine into other trainers' jobs, as
    # commands wire it into the CLI; no stage below imports them
    "targets": {"commands"},
}


def modules() -> dict[str, Path]:
    """Module name -> file, for askspec.runtime and askspec (lang, ir, top level)."""
    out: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if pkg == "askspec" and parts and parts[0] not in ("lang", "ir") and len(parts) > 1:
                continue
            out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules `name` imports (resolved to files of the tree where they are ours)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            found.add(mod)
            for a in node.names:  # `from askspec.runtime.engine import plan` imports a module
                if f"{mod}.{a.name}" in known:
                    found.add(f"{mod}.{a.name}")
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if name.startswith("askspec.runtime.") and len(parts) > 2 else None


def test_the_runtime_has_no_import_cycle():
    g = graph()
    runtime = {m for m in g if m.startswith("askspec.runtime")}
    internal = {m: {d for d in g[m] if d in runtime and d != m} for m in runtime}
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(internal[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(internal):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_stages_only_import_downwards():
    bad = []
    for m, deps in graph().items():
        own = stage(m)
        for d in deps:
            if own in FORBIDDEN and stage(d) in FORBIDDEN[own]:
                bad.append(f"{m} imports {d}")
            if m.startswith(("askspec.lang", "askspec.ir")) and d.startswith("askspec.runtime"):
                bad.append(f"{m} imports {d} (the language package never needs the runtime)")
    assert not bad, "\n".join(sorted(bad))


# The runtime reads the IR, not the checker (askspec/ir is the contract, its vocabulary
# askspec/ir/vocab.py). From askspec.lang it takes the template sandbox (the one Jinja2
# environment, which the checker parses templates in) and the spec paths, nothing else; it compiles a spec through askspec.api and
# prints diagnostics with askspec.diagnostics / askspec.span, which are not the checker's.
LANG_ALLOWED = {"askspec.lang.sandbox", "askspec.lang.paths"}


def test_the_runtime_imports_of_the_language_only_the_sandbox_and_paths():
    bad = []
    for m, deps in graph().items():
        if not m.startswith("askspec.runtime"):
            continue
        bad += [f"{m} imports {d}" for d in deps
                if (d == "askspec.lang" or d.startswith("askspec.lang.")) and d not in LANG_ALLOWED]
    assert not bad, "\n".join(sorted(bad))


def test_nothing_imports_the_tui():
    # askspec.cli, the entry point, is the one module that wires the `tui` command
    bad = [f"{m} imports {d}" for m, deps in graph().items() for d in deps
           if d.startswith("askspec.tui") and m != "askspec.cli"]
    assert not bad, "\n".join(bad)


def test_the_tui_reads_runs_through_the_store_not_the_commands():
    # the TUI and the commands are two front ends over the store (what both say of a run:
    # runtime/store/describe.py); the TUI's modules are parsed as the runtime's are
    tui = ROOT / "tui"
    known = set(modules())
    bad = []
    for path in tui.rglob("*.py"):
        rel = path.relative_to(tui).with_suffix("")
        name = ".".join(["askspec.tui", *[p for p in rel.parts if p != "__init__"]])
        bad += [f"{name} imports {d}" for d in imports_of(name, path, known)
                if d.startswith("askspec.runtime.commands") or d.startswith("askspec.runtime.targets")]
    assert not bad, "\n".join(sorted(bad))


def test_the_graph_sees_function_level_imports():
    g = graph()
    # resume reads the store inside a function; routing is imported by the session engine
    assert "askspec.runtime.store.views" in g["askspec.runtime.engine.resume"]
    assert "askspec.runtime.engine.routing" in g["askspec.runtime.engine.session"]
    assert len([m for m in g if m.startswith("askspec.runtime.")]) > 30
