"""`askspec run`: compile a spec, plan its sessions, run them on a backend and record
everything in a run directory; `--resume RUN_DIR` completes an interrupted run.

Wiring only: the options (options.py), what happens before the first session
(start.py), the models (resolver.py), the console (progress.py, noise.py), signals
(signals.py); here the engine runs and the run's status and exit code are decided."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any, Callable

from askspec.terminal import printable

from askspec.runtime.commands.options import (BACKEND_KINDS, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NO_SESSION_SUCCEEDED,
                                              EXIT_OK, RunOptions, UsageError)
from askspec.runtime.commands.resolver import ModelResolver  # noqa: F401  (bench scripts import it from here)

if TYPE_CHECKING:
    from askspec.runtime.commands.progress import Progress
    from askspec.runtime.commands.start import Started
    from askspec.runtime.engine.state import SessionResult
    from askspec.runtime.store.writer import RunWriter
    from askspec.runtime.train.trainer import LocalTrainer


def register(sub) -> None:
    p = sub.add_parser("run", help="run a spec's sessions and record them in a run directory",
                       description="Run a spec's sessions and record them in a run directory. Exit codes: 0 the run "
                                   "finished and a session succeeded, 1 an error (flags, spec, configuration, a run "
                                   "that failed), 3 no session succeeded, 130 interrupted.")
    p.add_argument("file", nargs="?", help="the .ask spec (optional with --resume)")
    p.add_argument("--backend", choices=BACKEND_KINDS, help="run every model on this backend (python callables stay in process)")
    p.add_argument("--model", action="append", metavar="ROLE=SPEC",
                   help="model for a role: a declared model, or backend:weights (other weights under the sampling "
                        "settings of the model the spec gives the role)")
    p.add_argument("--base-url", metavar="URL",
                   help="endpoint of the openai models, e.g. http://localhost:8000/v1 (a local vLLM or llama.cpp server)")
    p.add_argument("--served-model", action="append", metavar="[ROLE_OR_MODEL=]NAME",
                   help="the model name the server is asked for (every openai model, or one role or model)")
    p.add_argument("--endpoint", action="append", metavar="ROLE_OR_MODEL=URL",
                   help="the server of one role's or model's openai calls, in place of --base-url's (an OpenRLHF "
                        "job's evaluate stage: the evaluated weights on one server, its frozen models on others)")
    p.add_argument("--sessions", type=int, metavar="N", help="run at most N sessions (whole groups)")
    p.add_argument("--seed", type=int, help="run seed (default: the experiment's seed, else 0)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    p.add_argument("--data", action="append", metavar="NAME=FILE",
                   help="read data block NAME from FILE (JSON lines or parquet) instead of the spec's file, checked "
                        "against the block's declared fields (scripts/convert_data.py converts the papers' formats)")
    p.add_argument("--profile", metavar="NAME",
                   help="the configuration to run: one of the spec's profiles (default: the spec's `profile = NAME`)")
    p.add_argument("--out", default="runs", help="folder for run directories (default: runs)")
    p.add_argument("--replay", metavar="FILE", help="recorded replies (JSON) for the replay backend")
    p.add_argument("--concurrency", type=int, default=8, metavar="N", help="sessions in flight (default 8)")
    p.add_argument("--resume", metavar="RUN_DIR", help="complete the unfinished sessions of an earlier run")
    p.add_argument("--max-tokens", type=int, metavar="N", help="cap every model call at N new tokens (small CPU runs)")
    p.add_argument("--eval-only", action="store_true",
                   help="play the games without training, even when the spec has train blocks")
    p.add_argument("--stage", metavar="NAME",
                   help="with --eval-only: play one evaluate stage of the spec (its games, `samples` sessions per "
                        "element), recorded as the stage so `askspec metrics` reports its pass@k; without it: train "
                        "one retrain stage alone, from the models as given (--model ROLE=hf:CHECKPOINT)")
    p.add_argument("--weights", choices=("trained", "initial"),
                   help="with --stage: which weights the models run (recorded with each session; default trained)")
    p.add_argument("--promotions", metavar="FILE",
                   help="with --stage NAME of a retrain stage on promoted datasets (promoted = true): the nested "
                        "schedule's promotions, from the inner-loop service's state.json (an OpenRLHF job's "
                        "$ASKSPEC_INNER_STATE/state.json)")
    p.add_argument("--log", action="append", metavar="tensorboard[:DIR]|wandb[:PROJECT]",
                   help="also log every training step to TensorBoard (default folder: RUN_DIR/tensorboard) or "
                        "Weights & Biases (offline unless WANDB_MODE or an API key says otherwise)")
    p.add_argument("--quiet", action="store_true", help="no progress display (and no per-step training lines)")
    p.add_argument("--verbose", action="store_true", help="also show the libraries' own progress bars and warnings")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    try:
        opts = RunOptions.from_args(args)
    except UsageError as e:
        return _err(str(e))
    if not opts.verbose:
        # Only for the command: it owns its process (run_spec leaves its host's settings be).
        from askspec.runtime.commands.noise import silence_libraries

        silence_libraries()
    run = Run(opts, own_process=True)
    try:
        return asyncio.run(run.execute())
    except KeyboardInterrupt:  # raised outside the run's own handling (a second Ctrl-C)
        run.abandon("interrupted")
        return EXIT_INTERRUPTED


async def run_spec(file: str | None = None, *, own_process: bool = False, **options: Any) -> tuple[int, str | None]:
    """Programmatic `askspec run`: the same options as the command line, as keyword
    arguments under the flags' names (out=..., set=["probes=1"], replay=..., base_url=...).
    Returns (exit code, run dir).

    It leaves the process as it found it (gc, torch's threads, warnings filters, the
    environment): the host's to set. `own_process=True` makes the settings the command
    makes for a process that is nothing but this run (Run): for scripts that measure it."""
    try:
        opts = RunOptions.from_kwargs(file, **options)
    except UsageError as e:
        return _err(str(e)), None
    run = Run(opts, own_process=own_process)
    rc = await run.execute()
    return rc, run.run_dir


def _step_counts(writer: RunWriter, report: Any) -> dict:
    """Per trained role, the run's steps by `train_steps.skipped` code (None: the update ran),
    from the store (a resumed run's earlier steps included); this process's steps when the
    store cannot be read."""
    import warnings
    from collections import Counter

    from askspec.runtime.store.views import open_store

    try:
        with warnings.catch_warnings():  # a torn line is the store's to report, not this line's
            warnings.simplefilter("ignore")
            rows = open_store(writer.run_dir).execute(
                "SELECT role, skipped, count(*) FROM train_steps GROUP BY ALL").fetchall()
    except Exception:
        return report.counts() if report is not None else {}
    out: dict[str, Counter] = {}
    for role, skipped, n in rows:
        out.setdefault(role, Counter())[skipped] += int(n)
    return out


def _checkpoint_note(trainer: LocalTrainer) -> str | None:
    """What the run's checkpoints will hold on disk, when that is a lot (train_report.py's
    CHECKPOINT_NOTE_BYTES): from each trained role's loaded weights."""
    from askspec.runtime.commands.train_report import checkpoint_note, policy_bytes

    sizes = {role: policy_bytes(p) for role, p in trainer.policies.items()}
    return checkpoint_note({r: b for r, b in sizes.items() if b is not None}, trainer.steps,
                           min(c.save_every for c in trainer.configs), min(c.keep_checkpoints for c in trainer.configs))


def _err(msg: str) -> int:
    print(f"error: {printable(msg, single_line=True)}", file=sys.stderr)
    return EXIT_ERROR


class Run:
    """One `askspec run`: start, play the sessions, record how it ended.

    `own_process`: the run is the process's only business (the command line), so it
    makes the process-wide settings that speed it up, each before the threads that read
    it start: torch's CPU threads for its hf models (ModelResolver), the
    heap frozen while each phase runs (heap.py). Otherwise it changes nothing global."""

    def __init__(self, opts: RunOptions, own_process: bool = False) -> None:
        self.opts = opts
        self.own_process = own_process
        self.run_dir: str | None = None
        self.writer: RunWriter | None = None
        # a command built on `run` (rescore.py): told once the run directory exists, before the
        # first session, and just before the run's end is recorded
        self.on_started: Callable[[Started], None] | None = None
        self.on_finish: Callable[[RunWriter, str], None] | None = None

    async def execute(self) -> int:
        from askspec.runtime.commands.progress import Progress
        from askspec.runtime.commands.start import AlreadyFinished, start

        progress = Progress(0, 0, self.opts.quiet)
        try:
            started = await start(self.opts, progress.step, own_process=self.own_process)
        except AlreadyFinished as e:  # said; nothing loaded, nothing changed
            print(printable(str(e), single_line=True), file=sys.stderr)
            self.run_dir = self.opts.resume
            print(str(self.opts.resume))
            return EXIT_OK
        except UsageError as e:
            return _err(str(e))
        if started is None:
            return EXIT_ERROR  # the spec's diagnostics are printed
        self.writer, self.run_dir = started.writer, str(started.writer.run_dir)
        if self.on_started is not None:
            self.on_started(started)
        try:
            return await self._play(started, progress)
        finally:
            await started.resolver.aclose()

    async def _play(self, s: Started, progress: Progress) -> int:
        from askspec.runtime.commands.heap import frozen_heap
        from askspec.runtime.commands.signals import StopOnSignal
        from askspec.runtime.engine.session import Engine, RunAborted
        from askspec.runtime.engine.stateful import StatefulScorers

        opts, writer, trainer = s.options, s.writer, s.trainer
        progress.total = s.plan.total
        progress.done = progress.start_done = min(len(s.done), s.plan.total)
        engine_kw: dict[str, Any] = dict(writer=writer, resolve_model=s.resolver.resolve)
        what = f"{s.plan.total:,} sessions"
        step_sessions = None
        if trainer is not None:  # the local trainer plays the steps (docs/training.md)
            from askspec.runtime.commands.train_report import StepSessions
            from askspec.runtime.train.steplog import StepLog

            log = StepLog(writer)
            progress.total = trainer.planned_sessions()
            progress.done = progress.start_done = trainer.planner_sessions_before(trainer.start_step)
            # the declared metrics are shown per step, over its sessions: the engine records through a tap
            step_sessions = StepSessions(log, s.exp) if s.exp.metrics else None
            engine_kw = dict(writer=step_sessions or log, resolve_model=trainer.resolve,
                             rollout_roles=frozenset(trainer.policies), on_rollout=log.rollout)
            what = f"{trainer.planned_sessions():,} sessions in {trainer.steps} training step(s)"
        engine = Engine(trainer.engine_experiment() if trainer else s.exp, params=s.params, datasets=s.datasets,
                        seed=s.seed, concurrency=opts.concurrency, stateful=StatefulScorers(),
                        on_session_done=progress.session, on_turn=progress.turn, on_plan=progress.planned,
                        on_tokens=progress.stream_tokens, max_sessions=opts.sessions, on_warning=progress.warn,
                        around_phase=frozen_heap if self.own_process else contextlib.nullcontext, **engine_kw)
        print(f"run {writer.run_id}: {what} of {printable(s.exp.name)} ({s.experiment_hash[:12]}) "
              f"-> {writer.run_dir}", file=sys.stderr)
        progress.begin()
        report: Any = None
        loggers: list = []
        task: asyncio.Future[Any]  # the trainer's run returns nothing, the engine's the sessions' results
        if trainer is not None:
            made = self._training_output(s, trainer, progress)
            if made is None:
                return EXIT_ERROR
            report, loggers = made
            note = _checkpoint_note(trainer)
            if note:
                print(f"note: {note}", file=sys.stderr)
            declared_failed: list[str] = []

            def on_step(step: int, metrics: dict) -> None:
                declared = None
                if step_sessions is not None:
                    try:
                        rows = step_sessions.metrics(step)  # the step's sessions are forgotten either way
                        # an evaluate stage's step trains nothing and mixes its weights' sessions: not shown
                        declared = rows if metrics else None
                    except Exception as e:  # the metrics are shown, not needed: the training goes on
                        if not declared_failed:
                            declared_failed.append(str(e))
                            progress.warn(f"the declared metrics could not be evaluated over step {step}'s "
                                          f"sessions ({e.__class__.__name__}: {e}); `askspec metrics` evaluates "
                                          f"them after the run")
                lines = report.step(step, metrics, declared)
                if not opts.quiet:
                    for line in lines:
                        progress.note(line)
                for logger in list(loggers):
                    try:
                        logger.step(step, metrics, declared)
                    except Exception as e:  # a full disk, W&B gone: the training goes on, unlogged
                        loggers.remove(logger)
                        progress.warn(f"--log: {e.__class__.__name__}: {e}; no more steps are logged there "
                                      f"(train_steps has them all)")

            task = asyncio.ensure_future(trainer.run(engine, log, on_step))
        else:
            task = asyncio.ensure_future(engine.run(s.plan, s.done, s.prior, s.routed))
        ticker = asyncio.ensure_future(progress.tick()) if not opts.quiet else None
        status, failure = "failed", None
        results: list[SessionResult] = []
        try:
            with StopOnSignal(task):
                results = (await task) or []
            status = "finished"
        except asyncio.CancelledError:
            status = "interrupted"
        except RunAborted as e:
            status = "interrupted" if isinstance(e.cause, KeyboardInterrupt) else "failed"
            failure = f"a session raised {e} (not an error a session can recover from)"
        except Exception as e:
            failure = f"{e.__class__.__name__}: {e}"
        finally:
            if ticker is not None:
                ticker.cancel()
            try:
                progress.close()
                for logger in loggers:
                    try:
                        logger.close()
                    except Exception as e:  # the run's own records are complete either way
                        progress.warn(f"--log: {e.__class__.__name__}: {e}")
            finally:
                self.abandon(status)
        if not opts.quiet:
            from askspec.runtime.commands.bounds import closing_lines

            summary = progress.summary(status, str(writer.run_dir))  # its last line names the run directory
            summary[-1:-1] = closing_lines(s.exp, dict(progress.games), progress.roles)
            for line in summary + (report.summary() if report else []):
                print(line, file=sys.stderr)
        if status == "interrupted":
            print(f"interrupted: everything recorded so far is in {writer.run_dir}; continue with: "
                  f"askspec run --resume {writer.run_dir}", file=sys.stderr)
            return EXIT_INTERRUPTED
        if status == "failed":
            return _err(f"the run failed: {failure}; its status is 'failed' (see {writer.run_dir})")
        for line in engine.route_warnings():  # the run summary: judges that mostly gave no verdict
            print(f"warning: {printable(line, single_line=True)}", file=sys.stderr)
        judges = frozenset(t.judge for t in engine.judge_tallies.values() if t.failing)
        for line in progress.warnings(judges):  # roles (frozen ones too) whose replies often did not parse
            print(f"warning: {line}", file=sys.stderr)
        for line in report.warnings() if report else []:  # trained roles whose steps mostly had no signal
            print(f"warning: {line}", file=sys.stderr)
        if trainer is not None:
            from askspec.runtime.commands.train_report import trained_line

            print(f"{trained_line(list(trainer.policies), _step_counts(writer, report))}; schedule: "
                  f"{trainer.steps_done()}; weights in {writer.run_dir / 'checkpoints'}", file=sys.stderr)
        return self._summary(writer, results)

    def _training_output(self, s: Started, trainer: LocalTrainer, progress: Progress) -> tuple[Any, list] | None:
        """The per-step console lines' report and the --log loggers (None after printing
        why one could not start)."""
        from askspec.runtime.commands.loggers import open_loggers
        from askspec.runtime.commands.options import parse_log
        from askspec.runtime.commands.train_report import TrainReport

        config = {"experiment": s.exp.name, "experiment_hash": s.experiment_hash, "seed": s.seed,
                  "overrides": dict(s.options.overrides), "run_id": s.writer.run_id,
                  "algorithms": {c.role: c.algorithm for c in trainer.configs}, "steps": trainer.steps}
        try:
            loggers = open_loggers(tuple(parse_log(v) for v in s.options.log), run_id=s.writer.run_id,
                                   run_dir=s.writer.run_dir, config=config)
        except Exception as e:  # a logger that cannot start (a bad folder, W&B refusing): before any step
            progress.close()
            self.abandon("failed")
            _err(f"--log: {e.__class__.__name__}: {e}")
            return None
        return TrainReport(trainer.steps), loggers

    def abandon(self, status: str) -> None:
        """Record how the run ended, once (also when it ended some other way); a finished
        run is compacted to Parquet: later queries read it 10-25x faster."""
        writer = self.writer
        if writer is None or writer.closed:
            return
        if self.on_finish is not None:
            self.on_finish(writer, status)
        try:
            writer.finish(status, compact=(status == "finished"))
        except Exception as e:  # the sessions are recorded; a failed compaction loses nothing
            print(f"warning: {printable(str(e), single_line=True)}", file=sys.stderr)

    def _summary(self, writer: RunWriter, results: list[SessionResult]) -> int:
        errors = [r for r in results if r.status == "error"]
        ok = len(results) - len(errors)
        if errors:
            first = errors[0]
            print(printable(f"{len(errors)} of {len(results)} session(s) ended in error; first: "
                            f"{first.plan.session_id}: {first.error}", single_line=True), file=sys.stderr)
        print(str(writer.run_dir))
        if results and ok == 0:
            print("error: no session succeeded (exit code 3): the configuration is likely broken; "
                  "see the errors above", file=sys.stderr)
            return EXIT_NO_SESSION_SUCCEEDED
        return EXIT_OK
