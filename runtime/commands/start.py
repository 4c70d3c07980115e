"""Everything before `askspec run`'s first session: the options of a resumed run, the
compiled spec, the plan, the models (bound and prepared), and the run directory with
its manifest. Each problem is a UsageError (one `error:` line, exit 1), raised before a
new run directory is created where it can be."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal

from askspec.ir import model as ir
from askspec.ir.plansize import MAX_PLANNED_SESSIONS
from askspec.terminal import os_error, printable

from askspec.runtime.commands.options import RunOptions, UsageError, did_you_mean
from askspec.runtime.commands.resolver import ModelResolver

if TYPE_CHECKING:  # a run's parts, imported where they are made (the trainer's module loads torch's users)
    from askspec.runtime.engine.plan import Plan, SessionPlan
    from askspec.runtime.engine.state import SessionResult
    from askspec.runtime.store.writer import RunWriter
    from askspec.runtime.train.trainer import LocalTrainer


@dataclass
class Started:
    """A run ready for its engine."""

    options: RunOptions
    exp: ir.Experiment
    experiment_hash: str
    seed: int
    params: dict[str, Any]
    datasets: dict[str, list]
    plan: Plan | StagePlan  # a StagePlan for --stage
    resolver: ModelResolver
    writer: RunWriter
    done: set[str] = field(default_factory=set)  # a resumed run's finished sessions
    prior: dict[str, SessionResult] = field(default_factory=dict)  # their results
    routed: set[str] = field(default_factory=set)  # the groups whose route is recorded
    trainer: LocalTrainer | None = None  # when the run trains


class AlreadyFinished(UsageError):
    """--resume of a run that finished: nothing to do (said, exit 0; no model is loaded)."""


def resumed_options(opts: RunOptions) -> tuple[RunOptions, dict | None]:
    """For --resume: the options completed from the run's manifest, and the manifest."""
    from askspec.runtime.store import layout

    if not opts.resume:
        return opts, None
    if not layout.is_run_dir(opts.resume):
        raise UsageError(f"not a run directory: {opts.resume}")
    try:
        manifest = layout.load_manifest(opts.resume)  # checked: fields have the types a resume relies on
    except layout.ManifestError as e:
        raise UsageError(f"cannot resume: {e}") from None
    if manifest["status"] == "finished":
        ended = f" at {manifest['ended_at']}" if isinstance(manifest.get("ended_at"), str) else ""
        raise AlreadyFinished(f"run {manifest['run_id']} finished{ended}: there is nothing to resume "
                              f"(askspec runs {opts.resume} shows it; start the spec again for a new run)")
    saved = manifest.get("run_options") or {}
    opts = opts.resumed(saved)
    if not opts.overrides and isinstance(manifest.get("overrides"), dict):
        import json

        opts = _replace(opts, overrides={k: json.dumps(v) for k, v in manifest["overrides"].items()})
    if not opts.file:
        if not manifest.get("spec_path"):
            raise UsageError("cannot tell which spec this run used; pass the spec file")
        opts = _replace(opts, file=manifest["spec_path"])
    return opts, manifest


def _replace(opts: RunOptions, **changes: Any) -> RunOptions:
    import dataclasses

    return dataclasses.replace(opts, **changes)


def compile_spec(opts: RunOptions, manifest: dict | None):
    """The compiled spec (diagnostics printed), refusing a resume whose spec changed."""
    from askspec.ir.canonical import experiment_hash
    from askspec.api import compile_file

    assert opts.file is not None  # RunOptions.validate wants a spec or --resume, which resumed_options completes
    res = compile_file(opts.file, opts.overrides, opts.profile, data=opts.data)
    res.sink.emit(res.sources)
    if not res.ok or res.ir is None:  # ok: an IR and no error
        return None, None
    ehash = experiment_hash(res.ir)
    if manifest is not None and manifest.get("experiment_hash") != ehash:
        raise UsageError(f"refusing to resume {opts.resume}: its experiment hash "
                         f"{str(manifest.get('experiment_hash', '?'))[:12]} differs from the current spec's {ehash[:12]} "
                         f"(the spec, a prompt, a --set value, a --data file, the --profile or a training default of this askspec "
                         "version changed)")
    return res, ehash


def check_names(opts: RunOptions, exp: ir.Experiment) -> None:
    """--model names roles of this spec; --served-model and --endpoint name roles or models."""
    roles = [r.name for r in exp.roles]
    for role in opts.models:
        if role not in roles:
            raise UsageError(f"--model {role}=...: no role named '{role}'{did_you_mean(role, roles)}")
    models = [m.name for m in exp.models]
    for flag, keys in (("--served-model", opts.served_models), ("--endpoint", opts.endpoints)):
        for key in keys:
            if key and key not in roles and key not in models and key not in opts.models.values():
                raise UsageError(f"{flag} {key}=...: no role or model named '{key}'"
                                 f"{did_you_mean(key, roles + models)}")


def make_plan(opts: RunOptions, exp: ir.Experiment, spec_dir: str,
              seed: int) -> tuple[dict[str, Any], dict[str, list], Plan | StagePlan]:
    """(params, data sets, plan cut by --sessions); refuses a plan over the limit without one."""
    from askspec.runtime.engine.plan import load_dataset, plan_sessions

    params = exp.param_values()
    try:
        datasets = {d.name: load_dataset(d, spec_dir, seed) for d in exp.datasets}
        if opts.stage is not None and opts.eval_only:
            return params, datasets, stage_plan(exp, opts.stage, opts.weights or "trained", params, datasets, seed)
        full = plan_sessions(exp, params, datasets, seed)
        plan = plan_sessions(exp, params, datasets, seed, opts.sessions) if opts.sessions else full
    except OSError as e:
        raise UsageError(f"cannot plan sessions: {os_error(e, 'cannot read')}") from None
    except ValueError as e:
        raise UsageError(f"cannot plan sessions: {e}") from None
    for g in exp.games:
        if g.group_size > MAX_PLANNED_SESSIONS:
            raise UsageError(f"game '{g.name}' plans groups of {g.group_size:,} sessions, more than the limit of "
                             f"{MAX_PLANNED_SESSIONS:,}; a group runs whole, so it cannot run (W503)")
    if full.total > MAX_PLANNED_SESSIONS and (opts.sessions is None or opts.sessions > MAX_PLANNED_SESSIONS):
        raise UsageError(f"the spec plans {full.total:,} sessions, more than the limit of {MAX_PLANNED_SESSIONS:,} "
                         f"(W503): run a part of it with --sessions N")
    if plan.total == 0:
        raise UsageError("the spec plans no sessions (no games, or an empty data set)")
    return params, datasets, plan


@dataclass
class StagePlan:
    """`--stage NAME`: an evaluate stage's sessions for one weights, as the local trainer
    plans them (runtime/train/stages.py, eval_plans): the same seeds, groups and bindings."""

    stage: ir.Stage
    plans: list[SessionPlan]

    @property
    def total(self) -> int:
        return len(self.plans)

    def __len__(self) -> int:
        return len(self.plans)

    def __iter__(self) -> Iterator[SessionPlan]:
        return iter(self.plans)


def stage_plan(exp: ir.Experiment, name: str, weights: str, params: dict, datasets: dict, seed: int) -> StagePlan:
    from askspec.runtime.train.stages import eval_plans
    from askspec.runtime.train.planner import StepPlanner

    stage = next((s for s in exp.stages if s.name == name), None)
    if stage is None or stage.kind != "evaluate":
        names = [s.name for s in exp.stages if s.kind == "evaluate"]
        raise UsageError(f"--stage {name}: no evaluate stage of that name{did_you_mean(name, names)}"
                         + (f"; evaluate stages: {', '.join(names)}" if names else " (the spec has none)"))
    games = [g for g in exp.games if g.name in stage.options["games"]]
    elements = StepPlanner.elements_of(exp, games, params, dict(datasets))
    one = stage.model_copy(update={"options": {**stage.options, "weights": [weights]}})
    return StagePlan(stage, eval_plans(one, elements, seed, 0, 0)[weights])


def one_stage(exp: ir.Experiment, name: str, promotions: bool = False) -> ir.Experiment:
    """`--stage NAME` without --eval-only: the experiment whose stage list is that retrain
    stage alone, which the local trainer runs from the models as given (a cluster job runs
    a retrain stage so, with `--model ROLE=hf:CHECKPOINT` for the roles the stages before
    trained: docs/cluster.md, "Stages"). A stage on promoted datasets needs them given
    (`promotions`: --promotions FILE) unless the nested schedule promotes none (its outer
    reward is not grounded: no inner loop runs)."""
    stage = next((s for s in exp.stages if s.name == name), None)
    if stage is None or stage.kind != "retrain":
        names = [s.name for s in exp.stages if s.kind == "retrain"]
        raise UsageError(f"--stage {name} without --eval-only trains one retrain stage: no retrain stage of that "
                         f"name{did_you_mean(name, names)}" + (f"; retrain stages: {', '.join(names)}" if names else
                                                              " (the spec has none; --eval-only plays an evaluate stage)"))
    if stage.options.get("promoted") and not promotions and _promotes(exp):
        raise UsageError(f"--stage {name}: the stage trains on the promoted datasets of the run's nested schedule, "
                         f"which a run of the stage alone does not have: give them with --promotions FILE (the "
                         f"inner-loop service's state.json), or run the spec whole")
    # its one phase, as the compiler lowered it (the schedule's and the other stages' left out)
    cycles = [c for c in exp.train_cycles if c.phases[0].stage == name]
    return exp.model_copy(update={"stages": [stage], "train_cycles": cycles})


def _promotes(exp: ir.Experiment) -> bool:
    """Whether the spec's nested schedule can promote datasets (its inner loop runs)."""
    from askspec.runtime.train.nested import Settings

    return exp.schedule is not None and exp.schedule.kind == "nested" and Settings.of(exp).outer_reward == "grounded"


def given_promotions(opts: RunOptions) -> list[dict] | None:
    """--promotions FILE's promoted datasets (None without the flag); a bad file is the user's error."""
    if opts.promotions is None:
        return None
    from askspec.runtime.train.promotions import read_promotions

    try:
        return read_promotions(opts.promotions)
    except ValueError as e:
        raise UsageError(f"--promotions: {e}") from None


def stage_experiment(exp: ir.Experiment, plan: Plan | StagePlan) -> ir.Experiment:
    """The experiment the engine plays: for a --stage run, only the stage's games (the
    others, buffer replays included, are not part of it)."""
    if not isinstance(plan, StagePlan):
        return exp
    return exp.model_copy(update={"games": [g for g in exp.games if g.name in plan.stage.options["games"]]})


def check_replay(opts: RunOptions) -> None:
    """A bad recording is the user's input error: refuse before starting."""
    if not opts.replay:
        return
    from askspec.runtime.backends.base import BackendError
    from askspec.runtime.backends.replay import load_recording

    try:
        load_recording(Path(opts.replay))
    except BackendError as e:
        raise UsageError(str(e)) from None


def default_base_url(manifest: dict | None, warn: Callable[[str], None]) -> str | None:
    """The endpoint of openai models that name none: $OPENAI_BASE_URL for a new run; for a
    resumed one, the endpoint it recorded (whatever the variable says now)."""
    env = os.environ.get("OPENAI_BASE_URL") or None
    if manifest is None:
        return env.rstrip("/") if env else None
    from askspec.runtime.backends.openai_backend import DEFAULT_BASE_URL

    saved = (manifest.get("run_options") or {}).get("default_base_url") or DEFAULT_BASE_URL
    if env and env.rstrip("/") != saved:
        warn(f"OPENAI_BASE_URL is {env}, but this run used {saved}; resuming against {saved}")
    return saved


def warn(message: str) -> None:
    print(f"warning: {printable(message, single_line=True)}", file=sys.stderr)


def roles_record(exp: ir.Experiment, opts: RunOptions, resolver: ModelResolver,
                 previous: dict | None = None) -> dict[str, dict]:
    """The manifest's `roles`: per role its model and every model it ran on (backend,
    the model asked for, endpoint), earlier processes' included."""
    out: dict[str, dict] = {}
    for r in exp.roles:
        got = (previous or {}).get(r.name)
        before = got if isinstance(got, dict) else {}
        models = [m for m in before.get("models", []) if isinstance(m, dict)]
        for info in resolver.bound.get(r.name, []):
            if info not in models:
                models.append(info)
        out[r.name] = {"model": opts.models.get(r.name, r.model), "trained": r.trained, "models": models}
    return out


async def start(opts: RunOptions, line: Callable[[str], Callable[[str], None]], *,
                own_process: bool = False) -> Started | None:
    """Everything up to the first session; None when the spec has errors (printed).
    `own_process`: set torch's CPU threads from the models (commands/run.py, Run)."""
    from askspec.runtime.backends.base import BackendError
    from askspec.runtime.engine.session import SessionFailed

    opts, manifest = resumed_options(opts)
    res, ehash = compile_spec(opts, manifest)
    if res is None:
        return None
    exp = res.ir
    promotions = given_promotions(opts)
    if opts.stage is not None and not opts.eval_only:  # one retrain stage, trained alone
        exp = one_stage(exp, opts.stage, promotions is not None)
        res = dataclasses.replace(res, ir=exp)
    check_names(opts, exp)
    assert opts.file is not None  # compile_spec compiled it
    spec_dir = os.path.dirname(os.path.abspath(opts.file))
    seed = manifest["seed"] if manifest else (opts.seed if opts.seed is not None else int(exp.options.get("seed", 0) or 0))
    params, datasets, plan = make_plan(opts, exp, spec_dir, seed)
    check_replay(opts)
    trainer = prepare_training(opts, manifest, res, params, datasets, seed)
    if trainer is False:
        return None  # refused: the diagnostics are printed
    if promotions is not None and trainer is not None and trainer.inner is not None:
        trainer.inner.state.promotions = promotions  # what the stage's retrain_items read (a resume restores them)
    base = default_base_url(manifest, warn)
    resolver = ModelResolver(exp, opts, spec_dir, default_base_url=base if manifest else None, warn=warn,
                             set_torch_threads=own_process)
    try:
        await resolver.prepare(line)
    except (SessionFailed, BackendError) as e:
        await resolver.aclose()
        raise UsageError(str(e)) from None
    try:
        loaded = trainer is None or load_training(trainer, opts, res, resolver)
    except UsageError:  # a damaged checkpoint
        await resolver.aclose()
        raise
    if not loaded:
        await resolver.aclose()
        return None
    writer = open_writer(opts, manifest, res, ehash, seed, params, plan, resolver, base, trainer)
    started = Started(opts, stage_experiment(exp, plan), ehash, seed, params, datasets, plan, resolver, writer,
                      trainer=trainer)
    if trainer is not None:
        trainer.run_dir = writer.run_dir
        return started  # a training run replays from its newest checkpoint, not from finished sessions
    started.done = writer.completed_sessions()
    if manifest is not None and started.done:
        from askspec.runtime.engine.resume import load_prior
        from askspec.runtime.store import layout

        writer.flush()
        try:
            started.prior, started.routed = load_prior(str(writer.run_dir), started.done, plan)
        except layout.RunDirError as e:
            writer.finish("interrupted")
            await resolver.aclose()
            raise UsageError(f"cannot resume {opts.resume}: {e}") from None
    return started


def prepare_training(opts: RunOptions, manifest: dict | None, res, params: dict, datasets: dict,
                     seed: int) -> LocalTrainer | Literal[False] | None:
    """The local trainer when this run trains (a spec with train blocks, not --eval-only;
    a resumed run does what it did before), None when it does not, False when it refuses
    (its diagnostics printed, at the spec's lines)."""
    from askspec.runtime.train import runner as train_runner
    from askspec.runtime.train.checkpoints import CheckpointDamaged
    from askspec.runtime.train.trainer import TrainingRefused

    if manifest is not None and not manifest.get("training") and res.ir.training and not opts.eval_only:
        # (a run of this version records its training with the rest of its manifest, at once)
        raise UsageError(f"cannot resume {opts.resume}: the spec trains, but the run's manifest has no record of "
                         "its training (the run was stopped while it started, by an older askspec): it cannot "
                         "be told from an evaluation; start the spec again")
    if not train_runner.wants_training(res.ir, opts.eval_only, manifest):
        return None
    if opts.sessions is not None and manifest is None:
        raise UsageError("--sessions is for --eval-only runs: a training run plays each train block's `batch` sessions "
                         "per step for its `steps` (change them with --set on parameters, or in the spec)")
    try:
        trainer = train_runner.prepare(res.ir, params=params, datasets=datasets, seed=seed, resolver=None, run_dir=None)
    except TrainingRefused as e:
        train_runner.report_refusal(e, res.sources)
        return False
    except ValueError as e:
        raise UsageError(f"cannot plan training: {e}") from None
    if opts.resume:  # a damaged checkpoint is told before any model loads
        trainer.run_dir = Path(opts.resume)
        try:
            trainer.start_step = trainer.latest_checkpoint()
            problem = trainer.resume_problem(trainer.start_step) if trainer.start_step else None
        except CheckpointDamaged as e:
            problem = str(e)
        if problem is not None:
            raise UsageError(f"cannot resume {opts.resume}: {problem}")
    return trainer


def load_training(trainer: LocalTrainer, opts: RunOptions, res, resolver: ModelResolver) -> bool:
    """Load the trained weights (the newest checkpoint's on resume) before a new run
    directory exists, so that a refusal leaves nothing behind; False when refused."""
    from askspec.runtime.train import runner as train_runner
    from askspec.runtime.train.checkpoints import CheckpointDamaged
    from askspec.runtime.train.trainer import TrainingRefused

    trainer.resolver = resolver
    try:
        trainer.load_policies(resume_from=trainer.run_dir if trainer.start_step else None)
    except TrainingRefused as e:
        train_runner.report_refusal(e, res.sources)
        return False
    except CheckpointDamaged as e:
        raise UsageError(f"cannot resume {opts.resume}: {e}") from None
    return True


def determinism_record(opts: RunOptions, seed: int, resolver: ModelResolver) -> dict[str, Any]:
    """The manifest's `determinism`: per role and model, what running this spec again
    with the same seed and --concurrency can promise (README, "Reproducibility")."""
    roles: dict[str, dict[str, dict]] = {}
    for (role, _name), binding in resolver.bindings().items():
        roles.setdefault(role, {})[binding.name] = {"backend": type(binding.backend).name,
                                                    **binding.backend.determinism(opts.concurrency)}
    return {"seed": seed, "concurrency": opts.concurrency, "roles": roles}


def open_writer(opts: RunOptions, manifest: dict | None, res, ehash: str, seed: int, params: dict,
                plan: Plan | StagePlan, resolver: ModelResolver, base_url: str | None,
                trainer: LocalTrainer | None = None) -> RunWriter:
    """A new run directory, or the resumed one reopened; the manifest gets the options,
    and each model a role is bound to (now and as the run goes on). A new run's manifest
    is written once, complete (options, determinism, a training run's record), as the
    directory appears: no crash leaves one that resumes as another kind of run."""
    from askspec.ir.canonical import to_json
    from askspec.runtime.store.writer import RunLockedError, RunWriter

    exp = res.ir
    assert opts.file is not None  # compile_spec compiled it
    if manifest is None:
        if os.path.exists(opts.out) and not os.path.isdir(opts.out):
            raise UsageError(f"--out {opts.out} is a file; give a folder for run directories")
        # the profile the IR is (the spec's default one too): a resume and `askspec runs` see it
        recorded = {**opts.recorded(), "default_base_url": base_url, "profile": exp.options.get("profile")}
        fields: dict[str, Any] = dict(spec_path=os.path.abspath(opts.file), run_options=recorded,
                                      overrides={k: params[k] for k in opts.overrides if k in params},
                                      determinism=determinism_record(opts, seed, resolver))
        if trainer is not None:
            from askspec.runtime.train import runner as train_runner

            fields.update(training=train_runner.manifest_record(trainer), planned_sessions=trainer.planned_sessions())
        try:
            writer = RunWriter.create(opts.out, experiment=exp.name, experiment_hash=ehash, ir_json=to_json(exp),
                                      spec_files=res.files, seed=seed, roles=roles_record(exp, opts, resolver),
                                      params=params, planned_sessions=plan.total, argv=sys.argv, fields=fields)
        except OSError as e:
            raise UsageError(os_error(e, "cannot create a run directory in")) from None
    else:
        assert opts.resume is not None  # a manifest is a resumed run's
        try:
            writer = RunWriter.open_for_resume(opts.resume, argv=sys.argv)
        except RunLockedError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"cannot resume {opts.resume}: {os_error(e, 'cannot use')}") from None
        except (ValueError, KeyError, TypeError) as e:  # a damaged run directory
            raise UsageError(f"cannot resume {opts.resume}: {e}") from None
        for note in writer.notes:  # what the resume repaired (damaged lines moved, files rebuilt)
            warn(note)
        writer.annotate(roles=roles_record(exp, opts, resolver, writer.manifest.get("roles")),
                        determinism=determinism_record(opts, seed, resolver))

    def on_bind(role: str, info: dict) -> None:
        writer.annotate(roles=roles_record(exp, opts, resolver, writer.manifest.get("roles")),
                        determinism=determinism_record(opts, seed, resolver))

    resolver.on_bind = on_bind
    return writer
