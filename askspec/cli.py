"""The `askspec` command line: check, compile, fmt, run, query, runs, metrics, export, rescore, estimate, tui.

Usage errors (a bad flag, a mistyped command) are one `error:` line and exit code 1,
like every other error; `askspec run` adds 3 (no session succeeded) and 130
(interrupted)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from . import __version__
from .argtypes import whole_number
from .terminal import os_error, printable


def _overrides(pairs: list[str] | None, flag: str = "--set", form: str = "NAME=VALUE") -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            print(f"error: {flag} takes {form}, got {p!r}", file=sys.stderr)
            raise SystemExit(1)
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


DATA_HELP = "read data block NAME from FILE (JSON lines or parquet), checked against the block's fields"


def _data(args) -> dict[str, str]:
    """--data NAME=FILE: a user's file for a data block (askspec/lang/data_override.py)."""
    return _overrides(getattr(args, "data", None), "--data", "NAME=FILE")


class Parser(argparse.ArgumentParser):
    """argparse with askspec's error style: one `error:` line (with "did you mean" for
    a mistyped command or choice) and exit code 1, like every other usage error."""

    def error(self, message: str) -> NoReturn:
        from askspec.runtime.commands.options import did_you_mean  # the run options' own hint

        hint = ""
        if "invalid choice:" in message:
            try:
                bad = message.split("invalid choice: ", 1)[1].split("'")[1]
                choices = message.split("(choose from ", 1)[1].rstrip(")").replace("'", "").split(", ")
                hint = did_you_mean(bad, choices)
            except IndexError:
                pass
        elif message.startswith("unrecognized arguments:"):
            flags = [a for a in message.split(":", 1)[1].split() if a.startswith("-")]
            hints = [did_you_mean(f.split("=", 1)[0], self._all_flags()) for f in flags]
            hint = "".join(h for h in hints if h)
        self.print_usage(sys.stderr)
        self.exit(1, f"error: {message}{hint}\n")

    def _all_flags(self) -> list[str]:
        """Option strings of this parser and of its subcommands (an unknown flag is
        reported by the top-level parser, which does not know the subcommands' flags)."""
        flags = list(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    flags += list(sub._option_string_actions)
        return sorted(set(flags))


def cmd_check(args) -> int:
    from .lang.compiler import compile_file
    from .lang.plan_check import describe
    from .terminal import printable

    failed = False
    for path in args.files:
        res = compile_file(path, _overrides(args.set), args.profile, all_profiles=True, data=_data(args))
        res.sink.emit(res.sources, limit=args.max_diagnostics)
        if res.sink.has_errors:
            failed = True
        elif res.ir is not None and not args.quiet:
            from askspec.runtime.commands.estimate import summary_line  # the plan's bounds (`askspec estimate`)

            print(printable(f"{path}: {describe(res.ir)}", single_line=True), file=sys.stderr)
            print(printable(f"{path}: {summary_line(res.ir)}", single_line=True), file=sys.stderr)
    if not failed and not args.quiet:
        n = len(args.files)
        print(f"ok: {n} spec{'s' if n != 1 else ''} checked", file=sys.stderr)
    return 1 if failed else 0


def cmd_compile(args) -> int:
    from .ir import canonical, render
    from .lang.compiler import compile_file

    res = compile_file(args.file, _overrides(args.set), args.profile, data=_data(args))
    res.sink.emit(res.sources, limit=args.max_diagnostics)
    exp = res.ir
    if not res.ok or exp is None:  # ok implies an IR; the second test tells the type checker
        return 1
    if args.target:  # a job folder for a distributed trainer (docs/cluster.md)
        return _compile_target(args, res)
    if args.substitute or args.max_len is not None:
        print(f"error: {'--substitute' if args.substitute else '--max-len'} only applies with --target", file=sys.stderr)
        return 1  # a usage error (module docstring)
    fmt = args.format
    text = {
        "json": lambda: canonical.to_json(exp) + "\n",
        "text": lambda: render.to_text(exp),
        "dot": lambda: render.to_dot(exp),
        "mermaid": lambda: render.to_mermaid(exp),
        "hash": lambda: canonical.experiment_hash(exp) + "\n",
    }[fmt]()
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            _error(os_error(e, 'cannot write'))
            return 1
    else:
        sys.stdout.write(text)
    return 0


def _compile_target(args, res) -> int:
    if not args.output:
        print(f"error: --target {args.target} needs -o DIR (the job folder)", file=sys.stderr)
        return 1  # a usage error (module docstring)
    if args.target == "verifiers":
        if args.substitute or args.max_len is not None:
            print(f"error: {'--substitute' if args.substitute else '--max-len'} only applies with --target openrlhf",
                  file=sys.stderr)
            return 1  # a usage error (module docstring)
        from askspec.runtime.targets.verifiers.generate import compile_env

        return compile_env(res, args.file, args.output)
    try:
        substitutes = dict(p.split("=", 1) for p in args.substitute or [])
    except ValueError:
        print("error: --substitute takes ALGORITHM=ALGORITHM, e.g. --substitute cispo=grpo", file=sys.stderr)
        return 1  # a usage error (module docstring)
    if args.max_len is not None and args.max_len < 1:
        print(f"error: --max-len takes a positive number of tokens, not {args.max_len}", file=sys.stderr)
        return 1  # a usage error (module docstring)
    from askspec.runtime.targets.openrlhf.generate import compile_job
    from askspec.runtime.targets.openrlhf.mapping import ALGORITHMS

    bad = sorted(v for v in substitutes.values() if v not in ALGORITHMS)
    if bad:
        print(f"error: --substitute: OpenRLHF 0.11.2 cannot run {', '.join(bad)}; "
              f"choose one of {', '.join(ALGORITHMS)}", file=sys.stderr)
        return 1  # a usage error (module docstring)
    return compile_job(res, args.file, args.output, substitutes, _overrides(args.set), args.max_len)


def cmd_fmt(args) -> int:
    from .diagnostics import DiagnosticSink, Sources
    from .lang.fmt import format_source
    from .lang.parser import decode_source, parse, read_source

    status = 0
    for path in args.files:
        sink, sources = DiagnosticSink(), Sources()
        try:
            data = read_source(path)
        except OSError as e:
            _error(os_error(e, 'cannot read'))
            status = 1
            continue
        text = decode_source(path, data, sink)
        if text is not None:
            sources.add(path, text)
            parse(path, text, sink)
        if sink.has_errors or text is None:  # no text only after a reported error
            sink.emit(sources)
            status = 1
            continue
        out = format_source(text)
        if out != text:
            if args.check:
                print(printable(f"would reformat {path}", single_line=True), file=sys.stderr)
                status = 1
            else:
                problem = _write_in_place(path, out)
                if problem:
                    _error(f"cannot write {path}: {problem}")
                    status = 1
                else:
                    print(printable(f"reformatted {path}", single_line=True), file=sys.stderr)
    return status


def cmd_tui(args) -> int:
    from askspec.tui.app import run  # Textual loads only for this command

    return run(args.path)


def _write_in_place(path: str, text: str) -> str | None:
    """Replace the file at ``path`` (through symlinks) with ``text``; why not, or None.

    The text goes to a temporary file beside it that then replaces it, so a failure
    midway (a full disk) leaves the original intact. A file the user cannot write is
    refused, as an editor would, even where its folder would allow replacing it.
    """
    import tempfile

    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except OSError as e:
        return e.strerror or str(e)
    # no write bit: read-only for everyone, root included (as editors treat it)
    if not mode & 0o222 or not os.access(target, os.W_OK):
        return "permission denied (the file is read-only)"
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".fmt-", suffix=".tmp", dir=os.path.dirname(target))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode & 0o7777)
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        return e.strerror or str(e)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return None


def _error(message: str) -> None:
    print(printable(f"error: {message}", single_line=True), file=sys.stderr)


LANGUAGE_COMMANDS = ("check", "compile", "fmt")


def _max_diagnostics(c: argparse.ArgumentParser) -> None:
    from .diagnostics import MAX_PRINTED

    c.add_argument("--max-diagnostics", type=whole_number, default=MAX_PRINTED, metavar="N",
                   help=f"print at most N diagnostics per file, then a count of the rest (default {MAX_PRINTED}; 0: all)")


def _profile(c: argparse.ArgumentParser) -> None:
    c.add_argument("--profile", metavar="NAME",
                   help="the configuration to use: one of the spec's profiles (default: the spec's `profile = NAME`)")


def build_parser(runtime: bool = True) -> argparse.ArgumentParser:
    """The argument parser; `runtime=False` leaves out the runtime's subcommands, whose
    modules pull in pyarrow and DuckDB (a third of `askspec check`'s start-up)."""
    p = Parser(prog="askspec", description="Compile and run multi-model experiment specs (.ask files).")
    p.add_argument("--version", action="version", version=f"askspec {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    c = sub.add_parser("check", help="check specs and print diagnostics")
    c.add_argument("files", nargs="+")
    c.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    c.add_argument("--data", action="append", metavar="NAME=FILE", help=DATA_HELP)
    _profile(c)
    c.add_argument("-q", "--quiet", action="store_true")
    _max_diagnostics(c)
    c.set_defaults(func=cmd_check)

    c = sub.add_parser("compile", help="compile a spec to its game-graph IR")
    c.add_argument("file")
    c.add_argument("--format", choices=["json", "text", "dot", "mermaid", "hash"], default="json")
    c.add_argument("-o", "--output")
    c.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    c.add_argument("--data", action="append", metavar="NAME=FILE", help=DATA_HELP)
    _profile(c)
    _max_diagnostics(c)
    c.add_argument("--target", choices=["openrlhf", "verifiers"],
                   help="write to -o DIR instead of the IR: an OpenRLHF training job folder (openrlhf), or a verifiers "
                        "0.4.0 environment package (verifiers)")
    c.add_argument("--substitute", action="append", metavar="ALG=ALG",
                   help="with --target openrlhf: train with a supported algorithm in place of one the target lacks")
    c.add_argument("--max-len", type=int, metavar="TOKENS",
                   help="with --target openrlhf: the trained role's sequence length (default: the spec's budget, at "
                        "most the model's context)")
    c.set_defaults(func=cmd_compile)

    c = sub.add_parser("fmt", help="format specs in place (idempotent)")
    c.add_argument("files", nargs="+")
    c.add_argument("--check", action="store_true", help="only report files that would change")
    c.set_defaults(func=cmd_fmt)

    if runtime:
        from askspec.runtime.commands import estimate, metrics, query, rescore, run, runs

        for mod in (run, metrics, query, runs, estimate, rescore):
            mod.register(sub)
        c = sub.add_parser("tui", help="browse runs and sessions in the terminal UI")
        c.add_argument("path", metavar="PATH", nargs="?", default="runs",
                       help="a folder of runs or one run directory (default: runs)")
        c.set_defaults(func=cmd_tui)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(runtime=not (argv and argv[0] in LANGUAGE_COMMANDS))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # a path we could not use: one sentence naming it
        if os.environ.get("ASKSPEC_DEBUG"):
            raise
        print(f"error: {os_error(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # never a traceback for the user; ASKSPEC_DEBUG=1 shows it
        if os.environ.get("ASKSPEC_DEBUG"):
            raise
        print(f"error: internal error: {e.__class__.__name__}: {e} (set ASKSPEC_DEBUG=1 for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
