"""`askspec run`: compile a spec, plan its sessions, run them on a backend and record
everything in a run directory; `--resume RUN_DIR` completes an interrupted run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from askspec.ir import model as ir

BACKEND_KINDS = ("hf", "openai", "vllm", "python", "replay")


def register(sub) -> None:
    p = sub.add_parser("run", help="run a spec's sessions and record them in a run directory")
    p.add_argument("file", nargs="?", help="the .ask spec (optional with --resume)")
    p.add_argument("--backend", choices=BACKEND_KINDS, help="run every model on this backend")
    p.add_argument("--model", action="append", metavar="ROLE=SPEC", help="model for a role: a declared model or backend:weights")
    p.add_argument("--sessions", type=int, help="run at most N sessions (whole groups)")
    p.add_argument("--seed", type=int, help="run seed (default: the experiment's seed, else 0)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    p.add_argument("--out", default="runs", help="folder for run directories (default: runs)")
    p.add_argument("--replay", metavar="FILE", help="recorded replies (JSON) for the replay backend")
    p.add_argument("--concurrency", type=int, default=8, help="sessions in flight (default 8)")
    p.add_argument("--resume", metavar="RUN_DIR", help="complete the unfinished sessions of an earlier run")
    p.add_argument("--max-tokens", type=int, help="cap every model call at N new tokens (small CPU runs)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_run)


class ModelResolver:
    """Maps (role, model name) to a backend binding, honouring --backend and --model."""

    def __init__(self, exp: ir.Experiment, backend: str | None, role_models: dict[str, str], replay: str | None,
                 max_tokens: int | None, spec_dir: str) -> None:
        self.exp = exp
        self.backend = "replay" if replay else backend
        self.role_models = role_models
        self.replay = replay
        self.max_tokens = max_tokens
        self.spec_dir = spec_dir
        self._bindings: dict[tuple[str, str | None], Any] = {}

    def resolve(self, role: str, name: str | None):
        binding = self._bindings.get((role, name))
        if binding is None:
            binding = self._bindings[(role, name)] = self._resolve(role, name)
        return binding

    def _resolve(self, role: str, name: str | None):
        from askspec.runtime.backends.base import BackendError
        from askspec.runtime.backends.registry import make_backend
        from askspec.runtime.engine.session import ModelBinding, SessionFailed

        name = self.role_models.get(role, name)
        if name is None:
            raise SessionFailed(f"role '{role}' has no model: bind it in the game or pass --model {role}=...")
        m = self.exp.model(name)
        if m is not None:
            kind, weights, sampling, options = m.backend, m.weights, dict(m.sampling), dict(m.options)
        elif ":" in name and name.split(":", 1)[0] in BACKEND_KINDS:
            kind, weights = name.split(":", 1)
            sampling, options = {}, {}
        else:
            kind, weights, sampling, options = self.exp.options.get("backend", "hf"), name, {}, {}
        if self.backend:
            kind = self.backend
        # spec option names -> backend constructor options
        if "concurrency" in options:
            options["max_concurrency"] = options.pop("concurrency")
        if "retries" in options:
            options["attempts"] = int(options.pop("retries")) + 1
        if kind == "replay":
            options["file"] = self.replay or options.get("file")
            if not options["file"]:
                raise SessionFailed("the replay backend needs --replay FILE")
            if not os.path.isabs(options["file"]) and not os.path.exists(options["file"]):
                options["file"] = os.path.join(self.spec_dir, options["file"])  # relative to the spec
        if self.max_tokens:
            sampling["max_tokens"] = min(int(sampling.get("max_tokens", self.max_tokens)), self.max_tokens)
        try:  # the registry shares one backend per (kind, weights, options)
            backend = make_backend(kind, weights, options)
        except BackendError as e:
            raise SessionFailed(str(e)) from None
        return ModelBinding(name=name if m is not None or ":" in name else f"{kind}:{weights}", backend=backend,
                            weights=weights, sampling=sampling)

    async def aclose(self) -> None:
        from askspec.runtime.backends.registry import aclose_backends

        await aclose_backends()


class Progress:
    """Sessions done/total, sessions/s, tokens/s, ETA and outcome counts; one rewritten
    line on a terminal, plain periodic lines otherwise."""

    def __init__(self, total: int, already: int, quiet: bool, stream=None) -> None:
        self.total = total
        self.done = already
        self.start_done = already
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()
        self.tokens = 0
        self.outcomes: Counter = Counter()
        self._last = 0.0

    def planned(self, n: int) -> None:
        """A later phase (a game replaying a buffer) added n sessions."""
        self.total += n

    def turn(self, tokens: int) -> None:
        self.tokens += tokens
        self.maybe_print()

    def session(self, res) -> None:
        self.done += 1
        self.outcomes["error" if res.status == "error" else (res.outcome or "ok")] += 1
        self.maybe_print(force=not self.tty and self.done == self.total)

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = (self.done - self.start_done) / dt
        left = self.total - self.done
        eta = f"{left / rate:,.0f}s" if rate > 0 else "?"
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        return (f"sessions {self.done}/{self.total}  {rate:.2f} sess/s  {self.tokens / dt:,.1f} tok/s  ETA {eta}"
                + (f"  [{counts}]" if counts else ""))

    def maybe_print(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        interval = 0.25 if self.tty else 5.0
        if not force and now - self._last < interval:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def warn(self, message: str) -> None:
        """A warning line, shown even with --quiet (on a terminal, above the progress line)."""
        self.stream.write(("\r\x1b[2K" if self.tty and not self.quiet else "") + f"warning: {message}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()


def _parse_pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"{flag} takes NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


async def run_spec(file: str | None = None, **options: Any) -> tuple[int, str | None]:
    """Programmatic `askspec run`: the same options as the command line (as keyword
    arguments, e.g. out=..., set=["probes=1"], replay=...). Returns (exit code, run dir)."""
    ns = argparse.Namespace(file=file, backend=None, model=None, sessions=None, seed=None, set=None, out="runs",
                            replay=None, concurrency=8, resume=None, max_tokens=None, quiet=True)
    for key, value in options.items():
        if not hasattr(ns, key):
            raise TypeError(f"run_spec: unknown option {key!r}")
        setattr(ns, key, value)
    rc = await _run(ns)
    return rc, getattr(ns, "run_dir", None)


def cmd_run(args) -> int:
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130


def _err(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 1


async def _run(args) -> int:
    from askspec.ir.canonical import experiment_hash, to_json
    from askspec.lang.compiler import compile_file

    from askspec.runtime.engine.session import Engine
    from askspec.runtime.engine.plan import load_dataset, plan_sessions
    from askspec.runtime.engine.stateful import StatefulScorers
    from askspec.runtime.store import layout
    from askspec.runtime.store.writer import RunWriter

    try:
        overrides = _parse_pairs(args.set, "--set")
        role_models = _parse_pairs(args.model, "--model")
    except ValueError as e:
        return _err(str(e))
    manifest = None
    if args.resume:
        if not layout.is_run_dir(args.resume):
            return _err(f"not a run directory: {args.resume}")
        try:
            manifest = layout.load_manifest(args.resume)
        except layout.ManifestError as e:
            return _err(f"cannot resume: {e}")
        spec_path = args.file or manifest.get("spec_path")
        if not spec_path:
            return _err("cannot tell which spec this run used; pass the spec file")
        if not overrides:
            overrides = {k: json.dumps(v) for k, v in (manifest.get("overrides") or {}).items()}
        saved = manifest.get("run_options") or {}
        for key in ("backend", "replay", "sessions", "max_tokens"):
            if getattr(args, key) is None and saved.get(key) is not None:
                setattr(args, key, saved[key])
        if not role_models:
            role_models = saved.get("models") or {}
    else:
        if not args.file:
            return _err("give a spec file (or --resume RUN_DIR)")
        spec_path = args.file
    res = compile_file(spec_path, overrides)
    res.sink.emit(res.sources)
    if not res.ok:
        return 1
    exp = res.ir
    ehash = experiment_hash(exp)
    if manifest is not None and manifest.get("experiment_hash") != ehash:
        return _err(f"refusing to resume {args.resume}: its experiment hash {manifest.get('experiment_hash', '?')[:12]} "
                    f"differs from the current spec's {ehash[:12]} (the spec, a prompt or a --set value changed)")
    spec_dir = os.path.dirname(os.path.abspath(spec_path))
    seed = manifest["seed"] if manifest else (args.seed if args.seed is not None else int(exp.options.get("seed", 0) or 0))
    params = exp.param_values()
    try:
        datasets = {d.name: load_dataset(d, spec_dir, seed) for d in exp.datasets}
        plans = plan_sessions(exp, params, datasets, seed, args.sessions)
    except (OSError, ValueError) as e:
        return _err(f"cannot plan sessions: {e}")
    if not plans:
        return _err("the spec plans no sessions (no games, or an empty data set)")
    for role in role_models:
        if role not in {r.name for r in exp.roles}:
            return _err(f"--model {role}=...: no role named '{role}'")
    if args.replay:  # a bad recording is the user's input error: refuse before starting
        from askspec.runtime.backends.base import BackendError
        from askspec.runtime.backends.replay import load_recording

        try:
            load_recording(Path(args.replay))
        except BackendError as e:
            return _err(str(e))
    if manifest is None:
        roles_info = {r.name: {"model": role_models.get(r.name, r.model), "trained": r.trained} for r in exp.roles}
        try:
            writer = RunWriter.create(args.out, experiment=exp.name, experiment_hash=ehash, ir_json=to_json(exp),
                                      spec_files=res.files, seed=seed, roles=roles_info, params=params,
                                      planned_sessions=len(plans), argv=sys.argv)
        except OSError as e:
            return _err(f"cannot create a run directory under {args.out}: {e.strerror or e}")
        writer.manifest["spec_path"] = os.path.abspath(spec_path)
        writer.manifest["overrides"] = {k: params[k] for k in overrides if k in params}
        writer.manifest["run_options"] = {"backend": args.backend, "replay": os.path.abspath(args.replay) if args.replay else None,
                                          "sessions": args.sessions, "max_tokens": args.max_tokens, "models": role_models}
        layout.write_json_atomic(writer.run_dir / layout.MANIFEST, writer.manifest)
    else:
        try:
            writer = RunWriter.open_for_resume(args.resume, argv=sys.argv)
        except Exception as e:
            return _err(f"cannot resume {args.resume}: {e}")
        from askspec.terminal import printable

        for note in writer.notes:  # what the resume repaired (damaged lines moved, files rebuilt)
            print(f"warning: {printable(note, single_line=True)}", file=sys.stderr)
    done = writer.completed_sessions()
    prior, routed = {}, set()
    if manifest is not None and done:
        from askspec.runtime.engine.resume import load_prior

        writer.flush()
        try:
            prior, routed = load_prior(str(writer.run_dir), done, plans)
        except layout.RunDirError as e:
            writer.finish("interrupted")
            return _err(f"cannot resume {args.resume}: {e}")
    resolver = ModelResolver(exp, args.backend, role_models, args.replay, args.max_tokens, spec_dir)
    progress = Progress(len(plans), len([p for p in plans if p.session_id in done]), args.quiet)
    engine = Engine(exp, params=params, datasets=datasets, writer=writer, resolve_model=resolver.resolve, seed=seed,
                    concurrency=args.concurrency, stateful=StatefulScorers(), on_session_done=progress.session,
                    on_turn=progress.turn, on_plan=progress.planned, max_sessions=args.sessions, on_warning=progress.warn)
    print(f"run {writer.run_id}: {len(plans)} sessions of {exp.name} ({ehash[:12]}) -> {writer.run_dir}", file=sys.stderr)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(engine.run(plans, done, prior, routed))
    def on_signal() -> None:
        task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    args.run_dir = str(writer.run_dir)
    status = "finished"
    try:
        results = await task
    except asyncio.CancelledError:
        status = "interrupted"
        results = []
    except Exception as e:
        status = "failed"
        print(f"\nerror: the run failed: {e.__class__.__name__}: {e}", file=sys.stderr)
        results = []
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        progress.close()
        # a finished run is compacted to Parquet: later queries read it 10-25x faster
        writer.finish(status, compact=(status == "finished"))
        await resolver.aclose()
    if status == "interrupted":
        print(f"interrupted: everything recorded so far is in {writer.run_dir}; continue with: askspec run --resume {writer.run_dir}",
              file=sys.stderr)
        return 130
    for line in engine.route_warnings():  # the run summary: judges that mostly gave no verdict
        print(f"warning: {line}", file=sys.stderr)
    errors = [r for r in results if r.status == "error"]
    if errors:
        print(f"{len(errors)} session(s) ended in error; first: {errors[0].plan.session_id}: {errors[0].error}", file=sys.stderr)
    print(str(writer.run_dir))
    return 0 if status == "finished" else 1
