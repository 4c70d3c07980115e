"""The `askspec` command line: check, compile, fmt, run, query, runs, metrics, export, tui."""

from __future__ import annotations

import argparse
import os
import sys


def _overrides(pairs: list[str] | None) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            print(f"error: --set takes name=value, got {p!r}", file=sys.stderr)
            raise SystemExit(2)
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def cmd_check(args) -> int:
    from .lang.compiler import compile_file

    failed = False
    for path in args.files:
        res = compile_file(path, _overrides(args.set))
        res.sink.emit(res.sources)
        if res.sink.has_errors:
            failed = True
    if not failed and not args.quiet:
        n = len(args.files)
        print(f"ok: {n} spec{'s' if n != 1 else ''} checked", file=sys.stderr)
    return 1 if failed else 0


def cmd_compile(args) -> int:
    from .ir import canonical, render
    from .lang.compiler import compile_file

    res = compile_file(args.file, _overrides(args.set))
    res.sink.emit(res.sources)
    if not res.ok:
        return 1
    fmt = args.format
    text = {
        "json": lambda: canonical.to_json(res.ir) + "\n",
        "text": lambda: render.to_text(res.ir),
        "dot": lambda: render.to_dot(res.ir),
        "mermaid": lambda: render.to_mermaid(res.ir),
        "hash": lambda: canonical.experiment_hash(res.ir) + "\n",
    }[fmt]()
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            print(f"error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


def cmd_fmt(args) -> int:
    from .lang.diagnostics import DiagnosticSink, Sources
    from .lang.fmt import format_source
    from .lang.parser import decode_source, parse, read_source

    status = 0
    for path in args.files:
        sink, sources = DiagnosticSink(), Sources()
        try:
            data = read_source(path)
        except OSError as e:
            print(f"error: cannot read {path}: {e.strerror}", file=sys.stderr)
            status = 1
            continue
        text = decode_source(path, data, sink)
        if text is not None:
            sources.add(path, text)
            parse(path, text, sink)
        if sink.has_errors:
            sink.emit(sources)
            status = 1
            continue
        out = format_source(text)
        if out != text:
            if args.check:
                print(f"would reformat {path}", file=sys.stderr)
                status = 1
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(out)
                print(f"reformatted {path}", file=sys.stderr)
    return status


def cmd_tui(args) -> int:
    from askspec.tui.app import run  # Textual loads only for this command

    return run(args.path)


LANGUAGE_COMMANDS = ("check", "compile", "fmt")


def build_parser(runtime: bool = True) -> argparse.ArgumentParser:
    """The argument parser; `runtime=False` leaves out the runtime's subcommands, whose
    modules pull in pyarrow and DuckDB (a third of `askspec check`'s start-up)."""
    p = argparse.ArgumentParser(prog="askspec", description="Compile and run multi-model experiment specs (.ask files).")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="check specs and print diagnostics")
    c.add_argument("files", nargs="+")
    c.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=cmd_check)

    c = sub.add_parser("compile", help="compile a spec to its game-graph IR")
    c.add_argument("file")
    c.add_argument("--format", choices=["json", "text", "dot", "mermaid", "hash"], default="json")
    c.add_argument("-o", "--output")
    c.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    c.set_defaults(func=cmd_compile)

    c = sub.add_parser("fmt", help="format specs in place (idempotent)")
    c.add_argument("files", nargs="+")
    c.add_argument("--check", action="store_true", help="only report files that would change")
    c.set_defaults(func=cmd_fmt)

    if runtime:
        from askspec.runtime.commands import metrics, query, run

        for mod in (run, metrics, query):
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
    except Exception as e:  # never a traceback for the user; ASKSPEC_DEBUG=1 shows it
        if os.environ.get("ASKSPEC_DEBUG"):
            raise
        print(f"error: internal error: {e.__class__.__name__}: {e} (set ASKSPEC_DEBUG=1 for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
