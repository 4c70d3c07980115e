"""What every hook of askspec_ext shares: the OpenRLHF release it was written for, the
check that the code it hooks is that release's (a version and a SHA-256 fingerprint of
the hooked source, read from the installed files, so nothing of OpenRLHF is imported to
check it), the job's choices (job.json's `extension`, written by `askspec compile`), and
installing a hook in a Ray worker once the worker imports the module it hooks."""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

WRITTEN_FOR = "0.11.2"
JOB_FILE = Path(__file__).resolve().parents[1] / "job.json"  # the job folder's, beside this package


class VersionMismatch(RuntimeError):
    """The installed OpenRLHF is not the one this extension hooks."""


def installed_version() -> str:
    try:
        return importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def openrlhf_file(rel: str) -> Path:
    """A file of the installed OpenRLHF package (found, not imported)."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise VersionMismatch(f"askspec's OpenRLHF extension was written for OpenRLHF {WRITTEN_FOR}, which is not "
                              f"installed: install openrlhf=={WRITTEN_FOR} on every node")
    return Path(list(spec.submodule_search_locations)[0]) / rel


def method_source(rel: str, cls: str | None, name: str) -> str:
    """The source of method `cls.name` in OpenRLHF's file `rel`, or of its module-level
    function `name` where `cls` is None (a `<... not found>` marker when it is not there)."""
    path = openrlhf_file(rel)
    if not path.exists():
        return f"<{rel}: not found>"
    text = path.read_text(encoding="utf-8")
    body = ast.parse(text).body
    if cls is not None:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls), [])
    for item in body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
            return ast.get_source_segment(text, item) or ""
    return f"<{rel}: {cls + '.' if cls else ''}{name} not found>"


def fingerprint(sources: list[str]) -> str:
    return hashlib.sha256("\0".join(sources).encode("utf-8")).hexdigest()


def check(what: str, hooked: str, sources: list[str] | Callable[[], list[str]], expected: str, remedy: str) -> None:
    """Raise VersionMismatch unless OpenRLHF is WRITTEN_FOR and `sources` (the hooked code,
    described by `hooked`; a callable is called only once the version is the one) fingerprint
    to `expected`. The version comes first: under another release the hooked symbols may not
    exist at all (a renamed class), and the refusal must say which versions, not fail on
    them. The message names the hook and `remedy`, the way out for this job."""
    found = installed_version()
    problem = None
    if found != WRITTEN_FOR:
        problem = f"openrlhf {found} is installed"
    else:
        try:
            got = fingerprint(sources() if callable(sources) else sources)
        except (AttributeError, ImportError, OSError, TypeError, SyntaxError):  # a hooked symbol is gone
            got = None
        if got != expected:
            problem = f"openrlhf {found}'s {hooked} differs from the released {WRITTEN_FOR}'s (a patched install?)"
    if problem is not None:
        raise VersionMismatch(f"askspec's {what} was written for OpenRLHF {WRITTEN_FOR} (it hooks {hooked}), but "
                              f"{problem}: install openrlhf=={WRITTEN_FOR} on every node, or {remedy}")


def job_settings() -> dict[str, Any]:
    """What the job asks of the extension (job.json's `extension`): `advantage_std`
    (`population`: advantages.py) and `update_gate` (true: gate.py)."""
    if not JOB_FILE.exists():
        return {}
    from askspec.runtime.targets.openrlhf.jobfile import extension_of

    return extension_of(JOB_FILE)


def install_when_loaded(module: str, install: Callable[[], None]) -> None:
    """install() now if this process has imported `module`, else right after it does (a Ray
    worker's setup hook: a worker that never imports the module imports nothing for it)."""
    if module in sys.modules:
        install()
    elif not any(isinstance(f, _InstallAfterLoad) and f.module == module for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallAfterLoad(module, install))


class _InstallAfterLoad:
    """A meta path finder for one module: the module's own spec and loader, with install()
    run once the module has executed (then the finder leaves)."""

    def __init__(self, module: str, install: Callable[[], None]) -> None:
        self.module = module
        self.install = install

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
