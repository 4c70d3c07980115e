"""`askspec compile FILE --target openrlhf -o DIR`: write a self-contained OpenRLHF job
folder (agent, prompt data set, launch script, frozen-role servers, README; a driver and
one folder per phase when several roles are trained) from the templates beside this
module, or print the refusals (check.py) and write nothing."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from pydantic import BaseModel

from askspec import __version__
from askspec.ir import model as ir
from askspec.ir.canonical import experiment_hash
from askspec.ir.plansize import replays_buffer
from askspec.ir.vocab import HF_WEIGHTS_BACKENDS
from askspec.ir.walk import all_steps
from askspec.diagnostics import DiagnosticSink
from askspec.terminal import printable

from askspec.runtime.engine.plan import game_elements, load_dataset
from askspec.runtime.train.planner import Draw, StepPlanner
from askspec.runtime.targets.openrlhf import escape, jobfile, mapping, multi, stages, world
from askspec.runtime.targets.openrlhf.askspec_ext import carry
from askspec.runtime.targets.openrlhf.check import JobPlan, Phase, asks_of, check, roles_asked, span_of

MARKER = ".askspec-job"
GENERATED = ("README.md", "driver.sh", "agent.py", "job.json", "prompts.jsonl", "elements.jsonl", "launch.sh",
             "serve_frozen.sh", "spec", "askspec_ext", "askspec_nested.py", "world_check.py", multi.ENTRY)
FIRST_PORT = 8001
_TEMPLATES = Path(__file__).parent / "templates"
# copied as they are into the folder of every phase that needs it (mapping.extension: a loss
# OpenRLHF lacks, the population std, an update gate; _extension: the state carried across phases)
_EXTENSION = Path(__file__).parent / "askspec_ext"

# where each flag comes from, for the README's table
_WHY = {
    "--algo.advantage.estimator": "the algorithm (docs/cluster.md, algorithm table)",
    "--actor.policy_loss_type": "the algorithm",
    "--rollout.n_samples_per_prompt": "the group: the game's `sample N`, else `group`",
    "--eval.n_samples_per_prompt": "the group (the agent routes whole groups)",
    "--rollout.batch_size": "elements per optimizer step: `batch` sessions in whole groups (a session of "
                            "`sample N ask` siblings is one element)",
    "--train.batch_size": "rollouts per optimizer step, the elements' groups (one step per rollout batch)",
    "--train.num_episodes": "`steps`: passes over the elements",
    "--data.max_len": "`max_len`, else the role's calls per session x max_tokens + prompt room",
    "--reward.clip_range": "no clipping: rewards are summed as the spec says",
    "--train.seed": "the experiment's seed",
    "--rollout.max_new_tokens": "the trained role's max_tokens (askspec's default where the spec sets none, as a local call)",
    "--rollout.temperature": "the trained role's temperature",
    "--rollout.top_p": "the trained role's top_p",
    "--actor.adam.lr": "`lr`",
    "--actor.lr_warmup_ratio": "`warmup` / steps (each step's rate is then askspec's over the role's whole schedule: job.json's extension.lr_schedule)",
    "--actor.eps_clip_low_high": "`clip_low`, `clip_high`",
    "--actor.eps_clip": "`clip`",
    "--algo.kl.init_coef": "`kl` (0: no reference model)",
    "--algo.kl.use_loss": "`kl` > 0: KL as a loss term (GRPO style)",
    "--algo.kl.estimator": "`kl` > 0: `kl_estimator` (k3 unless the block says)",
    "--ckpt.save_steps": "`save_every` (askspec's default 25; one OpenRLHF step per askspec step)",
    "--ckpt.max_num": "`keep_checkpoints` (askspec's default 2)",
    "--train.micro_batch_size": "`micro_batch` (per GPU)",
    "--train.max_epochs": "`epochs`: updates per rollout batch",
    "--actor.dual_clip": "`dual_clip`",
    "--ds.param_dtype": "`dtype`",
    "--actor.adam.betas": "`beta1`, `beta2` (askspec's defaults 0.9, 0.999)",
    "--actor.adam.weight_decay": "`weight_decay` (default 0)",
    "--actor.max_norm": "`grad_clip` (default 1.0)",
    "--actor.lr_scheduler": "`decay`: constant (the default) or cosine",
    "--actor.min_lr_ratio": "`min_lr` / `lr`",
    "--actor.loss_agg_mode": "`aggregation` (the algorithm's default: grpo's and gspo's is per sequence)",
}


class JobError(Exception):
    """The job folder cannot be written (a user error: one line, no traceback)."""


@dataclass
class _Server:
    port: int
    served: str
    weights: str  # what vLLM loads: a Hugging Face id or a path
    comment: str
    ckpt_var: str | None = None  # an environment variable that overrides `weights` (a trained role's checkpoint)
    max_model_len: int | None = None


@dataclass
class _PhaseOut:
    phase: Phase
    dir: str
    pretrain: str
    elements: int
    lines: list[dict]
    flags: list[tuple[str, list[str]]]
    explained: list[tuple[str, list[str], str]]
    servers: list[_Server]
    endpoints: dict
    frozen: list[dict]
    frozen_trained: list[str]
    notes: list[str] = field(default_factory=list)
    replay: dict | None = None  # a phase whose game replays a buffer: job.json's `replay`
    pushes: bool = False  # its games push to a buffer (driver.sh commits the pushes after it)
    draw: dict | None = None  # a pushing phase of an alternating schedule: job.json's `draw` (phase_data.py)
    gpus: int = mapping.ACTOR_GPUS  # launch.sh's default ACTOR_GPUS: the most, up to mapping's, the batch fits

    # the names the templates use
    @property
    def role(self) -> str:
        return self.phase.role

    @property
    def games(self) -> list[str]:
        return self.phase.games

    @property
    def group(self) -> int:
        return self.phase.group

    @property
    def algorithm(self) -> str:
        return self.phase.algorithm

    @property
    def substituted(self) -> str | None:
        return self.phase.substituted


def compile_job(res, spec_path: str, out_dir: str, substitutes: dict[str, str],
                overrides: dict[str, str] | None = None, max_len: int | None = None) -> int:
    """Check `res` (a successful language compile) against OpenRLHF and write the job;
    returns the exit code. Refusals are diagnostics on stderr, and nothing is written.
    `max_len` (`--max-len`) replaces the sequence budget the spec implies."""
    exp: ir.Experiment = res.ir
    sink = DiagnosticSink()
    plan = check(exp, res.sources, spec_path, substitutes, sink)
    if plan is None or sink.has_errors:
        sink.emit(res.sources)
        return 1
    try:
        phases = _build(exp, plan, spec_path, sink, max_len)
    except JobError as e:
        sink.emit(res.sources)
        print(f"error: {printable(str(e), single_line=True)}", file=sys.stderr)
        return 1
    sink.emit(res.sources)  # the check's and the build's (a batch the job could not start with)
    if sink.has_errors:
        return 1
    try:
        _write(exp, res, plan, phases, spec_path, Path(out_dir), substitutes, overrides or {})
    except JobError as e:
        print(f"error: {printable(str(e), single_line=True)}", file=sys.stderr)
        return 1
    print(f"wrote OpenRLHF job for {printable(exp.name, single_line=True)} to {printable(out_dir, single_line=True)}",
          file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------- plan
def _build(exp: ir.Experiment, plan: JobPlan, spec_path: str, sink: DiagnosticSink | None = None,
           max_len_flag: int | None = None) -> list[_PhaseOut]:
    try:
        exp.name.encode("utf-8")  # a file name's undecodable bytes come in as lone surrogates
    except UnicodeEncodeError:
        raise JobError(f"the spec's file name {escape.line(os.path.basename(spec_path))} is not valid UTF-8: "
                       "rename the file (the name becomes the experiment's)") from None
    seed = int(exp.options.get("seed", 0) or 0)
    params = exp.param_values()
    datasets = _datasets(exp, spec_path)
    trained = [p.role for p in plan.phases]
    out = []
    for phase in [*plan.phases, *(s.phase for s in plan.stages if s.phase is not None)]:
        role = exp.role(phase.role)
        model = _role_model(exp, phase.role)
        sampling = role.resolved_sampling  # on its declared model, the IR's defaults included (as a local run's calls)
        games = [g for g in exp.games if g.name in phase.games]
        lines = []
        replay = _replay(exp, phase, games)
        for g in games:
            if replay is not None:
                break  # its prompts are drawn from the buffer when the phase starts (phase_data.py)
            try:  # a retrain stage plays the game over its own data set's items
                elements = [{g.pattern[0]: item} for item in datasets[phase.data]] if phase.data else \
                    game_elements(g, params, datasets)
            except Exception as e:  # EvalError or ValueError from the game's `for` expression
                raise JobError(f"game {g.name}: cannot list its elements: {e}") from None
            for i, bindings in enumerate(elements):
                lines.append(prompt_line(g.name, i, bindings))
        if not lines and replay is None:
            raise JobError(f"the games of role '{phase.role}' have no elements (an empty data set?)")
        # a rollout of siblings holds one reply of the session's (its attempts: a resampled one is cut)
        calls = max(max(1, g.call_bounds.get(phase.role, 1) // phase.siblings.get(g.name, 1)) for g in games)
        # a turn's budget: the role's, or an ask's own `with sampling { max_tokens }` where larger
        # (the agent caps each call at what is left of max_len, so max_len must hold the largest)
        turn_tokens = max([int(sampling["max_tokens"])] + [
            _ask_max_tokens(s, phase.role) for g in games for s in all_steps(g.body)
            if s.kind == "ask" and phase.role in s.roles and "max_tokens" in s.sampling_for(phase.role)])
        max_len, len_note = _max_len(exp, phase, model, calls * turn_tokens + mapping.CONTEXT_ALLOWANCE, max_len_flag,
                                     sink, spec_path)
        batch = mapping.lowered(phase.training).batch
        pushes = any(s.kind == "push" for g in games for s in all_steps(g.body))
        draw = _draw(exp, phase, games) if pushes and replay is None else None
        if replay is not None:  # `steps` batches of `items` drawn items: one pass, a step per batch
            sched = mapping.schedule(replay["steps"] * replay["items"], phase.group, replay["items"], replay["steps"])
        elif draw is not None:  # the local steps' elements, drawn per iteration: one pass, a step per local step
            sched = mapping.schedule(draw["steps"] * draw["items"], phase.group, draw["items"], draw["steps"])
        elif phase.inner_loop is not None or phase.sample_calls:  # nested: one outer session (prompt) a step
            sched = mapping.schedule(len(lines), phase.group, 1, phase.steps)
        elif batch is None:  # up to 16 elements a step: a step's rollouts must cover the actor processes
            sched = mapping.schedule(len(lines), phase.group, min(len(lines), 16), phase.steps)
        else:
            prompts = step_prompts(exp, phase, games[0])
            # the local run's steps (a block without `steps`: the schedule's, else 1)
            steps = phase.steps if phase.steps is not None else mapping.lowered(phase.training).steps
            n_elements = len(lines)
            lines = _planned_lines(exp, phase, games, params, datasets, seed, steps)
            sched = mapping.schedule(len(lines), phase.group, prompts, steps)
            sched.notes.insert(0, f"prompts.jsonl holds the groups the local steps play ({len(lines)} lines from the "
                                  f"{n_elements} elements, {prompts} a step, in plan order, cycling: the local "
                                  "planner's walk), each labelled with its place in the local schedule, whose seeds "
                                  "and group id the agent plays it under; OpenRLHF reads them in order "
                                  "(askspec_ext/sequential.py), so the job's step k plays the local step k's groups")
        flags = mapping.training_flags(phase.algorithm, phase.training, phase.group, sched, sampling, max_len, seed)
        flags += mapping.setting_flags(phase.training)
        gpus = _actor_gpus(flags)
        if gpus is None:
            _micro_batch_refused(exp, phase, sched, sink, spec_path)
            continue
        explained = [(f, v, _WHY.get(f, "")) for f, v in flags]
        others = [r for r in trained if r != phase.role and _asked(games, r)]
        servers, endpoints, frozen = _frozen(exp, games, phase.role, others)
        notes = [_step_difference(exp, phase, games[0], sched)] + list(sched.notes) + ([len_note] if len_note else [])
        if gpus < mapping.ACTOR_GPUS:
            notes.append(f"ACTOR_GPUS defaults to {gpus}, not {mapping.ACTOR_GPUS}: DeepSpeed needs a step's "
                         f"{sched.rollouts_per_step} rollouts (--train.batch_size) to be a whole multiple of the actor "
                         "GPUs (launch.sh checks the values it is given: docs/cluster.md, \"Batch sizes and GPUs\")")
        size = local_phase(exp, phase, games[0]).groups[games[0].name]
        played = step_prompts(exp, phase, games[0]) * size
        if batch is not None and played != batch:
            notes.append(f"batch = {batch} sessions in whole groups of {size}: each step plays {played} sessions, "
                         "as a local run does")
        shared = [f["role"] for f in frozen if f["role"] not in others and _derives_from(exp, exp.role(f["role"]).model, model.name)]
        if shared:
            notes.append(f"{', '.join(shared)} play(s) on '{role.model}' (the trained role's model) or a model derived "
                         "from it: served frozen with the initial weights, not the ones being trained")
        if any(g.call_bounds.get(phase.role, 0) > 1 for g in games) and role.recover.mode == "prompt" and \
                (role.recover.malformed or role.recover.truncated):
            notes.append(f"'{phase.role}' keeps a recovered attempt and its recovery prompt in its token sequence "
                         "(docs/cluster.md, \"What differs from a local run\")")
        stateful = [f"{fn}()" for fn in ("diversity", "novelty") if any(_calls(g, fn) for g in games)]
        if stateful:
            notes.append(f"{' and '.join(stateful)}: every agent of the job, on any phase, engine or node, scores "
                         "against one history ($ASKSPEC_HISTORY, on the run store) in the order the calls arrive, where "
                         "a local run adds a phase's sessions in session order (docs/cluster.md, \"What differs from a "
                         "local run\")")
        if replay is not None:
            notes.append(f"game '{replay['game']}' replays buffer '{replay['buffer']}': driver.sh writes this phase's "
                         f"prompts.jsonl when it starts, {replay['steps']} step(s) of {replay['items']} item(s) drawn in "
                         "circular order from the buffer as it stands (docs/cluster.md, \"Buffers\")")
        out.append(_PhaseOut(phase=phase, dir=phase.dir,
                             pretrain=_weights(model), elements=len(lines), lines=lines, flags=flags,
                             explained=explained, servers=servers, endpoints=endpoints, frozen=frozen,
                             frozen_trained=others, notes=notes, replay=replay, pushes=pushes, draw=draw,
                             gpus=gpus))
    return out


def _step_difference(exp: ir.Experiment, phase: Phase, game: ir.Game, sched: mapping.Schedule) -> str:
    """The README's line on a step's batch: the rollouts one optimizer step of the job
    trains on against a local step's (a learning rate tuned on one transfers to the other
    only when they are equal)."""
    local = step_prompts(exp, phase, game) if not (phase.inner_loop or phase.sample_calls) else 1
    job = (f"a step of this job trains on {sched.prompts_per_step} prompt(s) x {phase.group} rollouts = "
           f"{sched.rollouts_per_step} (--rollout.batch_size x --rollout.n_samples_per_prompt = --train.batch_size)")
    if local == sched.prompts_per_step:
        return f"{job}, as a local step does"
    # `batch` counts sessions: a prompt's group of sessions, or one session whose `sample N` replies are the group
    same = sched.prompts_per_step if game.name in phase.siblings else sched.rollouts_per_step
    return (f"{job}, where a local step trains on {local} x {phase.group} = {local * phase.group} "
            f"({'one group: the train block has no `batch`' if 'batch' not in phase.training.given else '`batch`'}): "
            "the gradient averages over more rollouts, so a learning rate tuned locally may not transfer; set "
            f"`batch = {same}` for the same step on both")


def model_context(weights: str) -> tuple[int, str] | None:
    """(the context in tokens, where it was read) of the model vLLM and DeepSpeed load as
    `weights` (a Hugging Face id or a local folder): `max_position_embeddings` of a local
    folder's config.json, else mapping.CONTEXTS' (the packaged models'); None when neither
    says (a Hub id is not fetched at compile time: docs/cluster.md, "Sequence length")."""
    try:  # as vLLM reads it: the scripts pass the weights quoted, so a "~" is not the home folder
        config = Path(weights) / "config.json"
        if config.is_file():
            n = json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                return n, f"max_position_embeddings in {config}"
    except (OSError, ValueError, AttributeError):
        pass  # unreadable: the job's own load reports it
    if weights in mapping.CONTEXTS:
        return mapping.CONTEXTS[weights], f"max_position_embeddings in {weights}'s config.json"
    return None


def _max_len(exp: ir.Experiment, phase: Phase, model: ir.Model, budget: int, given: int | None,
             sink: DiagnosticSink | None, spec_path: str) -> tuple[int, str | None]:
    """--data.max_len of a phase (vLLM's max_model_len too) and a README note: `given`
    (`compile --max-len`), refused (E609) above the model's known context; else the spec's
    budget (the trained role's calls x max_tokens + prompt room), capped at the context as
    a local run's hf backend caps each reply at what the context leaves."""
    context = model_context(_weights(model))
    if given is not None:
        if context is not None and given > context[0]:
            message = (f"--max-len {given} exceeds the context of model '{model.name}' (trained role '{phase.role}'): "
                       f"{context[0]} tokens ({context[1]}); vLLM refuses a max_model_len above it")
            if sink is None:
                raise JobError(message)
            sink.error("E609", message, span_of(phase.training.span, spec_path),
                       f"pass --max-len {context[0]} or less, or train a model with a longer context")
        return given, None
    if context is not None and budget > context[0]:
        return context[0], (f"max_len is the model's context, {context[0]} tokens ({context[1]}), not the spec's budget "
                            f"of {budget} (the calls of '{phase.role}' x max_tokens + {mapping.CONTEXT_ALLOWANCE} for prompts): "
                            "each call gets what the context leaves, as in a local run")
    return budget, None


def _actor_gpus(flags: list[tuple[str, list[str]]]) -> int | None:
    """launch.sh's default ACTOR_GPUS for a job of `flags` on one node: the most GPUs, up
    to mapping.ACTOR_GPUS, with which OpenRLHF's and DeepSpeed's batch rules hold
    (world.py); None when no count does (the micro batch does not divide the step)."""
    argv = [x for f, v in flags for x in (f, *v)] + ["--actor.num_nodes", "1"]
    fits = world.fitting_gpus(world.settings(argv), mapping.ACTOR_GPUS)
    return max(fits) if fits else None


def _micro_batch_refused(exp: ir.Experiment, phase: Phase, sched: mapping.Schedule, sink: DiagnosticSink | None,
                         spec_path: str) -> None:
    """E604 for a `micro_batch` that divides no step of the job: DeepSpeed's batch must be
    a whole multiple of micro batch x actor GPUs, even on one GPU."""
    micro = mapping.lowered(phase.training).micro_batch
    message = (f"`micro_batch = {micro}` does not divide a step's {sched.rollouts_per_step} rollouts of '{phase.role}' "
               "(--train.batch_size): DeepSpeed needs the batch to be a whole multiple of the micro batch x the actor "
               "GPUs, so the job could not start on any number of GPUs")
    if sink is None:
        raise JobError(message)
    sink.error("E604", message, span_of(phase.training.span, spec_path),
               f"choose a `micro_batch` that divides {sched.rollouts_per_step}")


def _draw(exp: ir.Experiment, phase: Phase, games: list[ir.Game]) -> dict | None:
    """How a pushing phase of an alternating schedule draws its prompts: each iteration's
    phase plays the elements the local schedule's steps take (phase_data.py prompts), so
    the pushes reach the buffer as a local run's; `items` per step as the trainer's
    StepPlanner takes them (`batch` in whole groups, one group without)."""
    if exp.schedule is None or exp.schedule.kind != "alternating" or phase.steps is None or not games:
        return None
    return {"steps": phase.steps, "items": step_prompts(exp, phase, games[0])}


def _planned_lines(exp: ir.Experiment, phase: Phase, games: list[ir.Game], params: dict[str, Any],
                   datasets: dict[str, list], seed: int, steps: int) -> list[dict]:
    """A prompt line per group of the `steps` steps the local schedule's phase (`local_phase`)
    plays, as its StepPlanner walks them (the one walk: whole steps, the spec's steps
    exactly, where passes over the elements would not be whole steps: OpenRLHF 0.11.2
    trains a pass's remainder as a step of its own). Each line's label carries the group's
    Draw where the local run plays it under the job's seed (not a retrain stage's data, whose
    planner has seeds of its own, nor a phase that several iterations walk on: phase_data.py
    draws those), so the agent plays the local group's seeds and group id."""
    from askspec.runtime.train import schedule
    from askspec.runtime.train.nested import data_name

    local = local_phase(exp, phase, games[0])
    collections = dict(datasets)
    if phase.data:  # a retrain stage plays the game over the stage's data set
        collections[data_name(games[0]) or ""] = datasets[phase.data]
    groups = {g.name: local.groups.get(g.name, phase.group) for g in games}
    try:
        planner = StepPlanner(exp, games, params, collections, seed, groups, local.batch)
    except Exception as e:  # EvalError or ValueError from a game's `for` expression
        raise JobError(f"cannot list the elements of {', '.join(g.name for g in games)}: {e}") from None
    slots = [sl for sl in schedule.slots(exp) if sl.phase == local]
    drawn = not phase.data and len(slots) == steps and all(sl.iteration == 1 for sl in slots)
    lines: dict[int, dict] = {}  # each element's line, made once (a long walk passes over them many times)
    out = []
    for n in range(1, steps + 1):
        for element, draw in planner.groups(n, slots[n - 1].step if drawn else n):
            line = lines.get(id(element))
            if line is None:
                line = lines[id(element)] = prompt_line(element.game.name, element.item_index, element.bindings)
            out.append(with_draw(line, draw) if drawn else line)
    return out


def step_prompts(exp: ir.Experiment, phase: Phase, game: ir.Game) -> int:
    """The elements of `game` one local step of the phase plays, which are the job's
    prompts of one OpenRLHF step (--rollout.batch_size): the local run's lowered phase
    (ir.TrainPhase) that trains the job's role on the game: the items it replays, else the
    elements its planner takes, each a whole group, until they reach its `batch`. A session
    whose `sample N ask` replies are the group is one element: there `batch` counts
    prompts, each of N rollouts."""
    local = local_phase(exp, phase, game)
    if game.name in local.replay_items:
        return local.replay_items[game.name]
    return -(-local.batch // local.groups[game.name])


def local_phase(exp: ir.Experiment, phase: Phase, game: ir.Game) -> ir.TrainPhase:
    """The local schedule's phase that a job's phase mirrors: a retrain stage's (a phase
    with the stage's data set), else the phase playing `game` that updates the role."""
    kind = "retrain" if phase.data else "play"
    return next(ph for ph in exp.train_phases() if ph.kind == kind and phase.role in ph.roles and game.name in ph.groups)


def _extension(p: _PhaseOut, plan: JobPlan) -> dict[str, Any]:
    """What the phase's askspec_ext installs; the update gate only in the RL schedule's phases,
    and in a schedule of several phases the role's state carried between them
    (askspec_ext/carry.py; driver.sh passes its checkpoint flags)."""
    scheduled = any(p.phase is q for q in plan.phases)
    out = mapping.extension(p.algorithm, p.phase.training, scheduled)
    if scheduled and len(plan.phases) > 1:
        out["carry_state"] = True
    return out


def _replay(exp: ir.Experiment, phase: Phase, games: list[ir.Game]) -> dict | None:
    """How a phase whose game replays a buffer draws its prompts (check.py allows one such
    game per phase, in an alternating schedule): the local schedule's `items` per step
    (its lowered phase's `replay_items`)."""
    game = next((g for g in games if replays_buffer(g) is not None), None)
    if game is None or phase.steps is None:
        return None
    return {"game": game.name, "buffer": replays_buffer(game), "steps": phase.steps,
            "items": step_prompts(exp, phase, game)}


def _datasets(exp: ir.Experiment, spec_path: str) -> dict[str, list]:
    spec_dir = os.path.dirname(os.path.abspath(spec_path))
    try:
        return {d.name: load_dataset(d, spec_dir, int(exp.options.get("seed", 0) or 0)) for d in exp.datasets}
    except (OSError, ValueError) as e:
        raise JobError(f"cannot read the spec's data: {e}") from None


def _derives_from(exp: ir.Experiment, name: str | None, base: str) -> bool:
    seen = set()
    while name and name not in seen:
        if name == base:
            return True
        seen.add(name)
        m = exp.model(name)
        name = m.derived_from if m is not None else None
    return False


def prompt_line(game: str, index: int, bindings: dict, draw: Draw | None = None) -> dict:
    """A prompt line: the game's element, and where the local schedule plays it (`draw`:
    the agent then plays the group under the local run's seeds and group id)."""
    shown = json.dumps(bindings, ensure_ascii=False, default=str)
    if len(shown) > 200:
        shown = shown[:197] + "..."
    label = json.dumps({"game": game, "element": index, "bindings": bindings}, ensure_ascii=False, default=str)
    line = {"prompt": f"{game} #{index} {shown}", "label": label}
    return with_draw(line, draw) if draw is not None else line


def with_draw(line: dict, draw: Draw) -> dict:
    """`line` (a prompt line without a draw) labelled with `draw`: the label's JSON object
    with one more key, spliced in rather than parsed and written again (a long walk writes
    the same element's line thousands of times)."""
    label = line["label"]
    return {**line, "label": label[:-1] + ', "draw": ' + json.dumps(draw.label()) + "}"}


def _asked(games: list[ir.Game], role: str) -> bool:
    return any(True for g in games for _ in asks_of(g.body, role))


def _calls(node: Any, fn: str) -> bool:
    if isinstance(node, ir.CallFn) and node.fn == fn:
        return True
    if isinstance(node, BaseModel):
        return any(_calls(getattr(node, k), fn) for k in type(node).model_fields if k != "span")
    if isinstance(node, (list, tuple)):
        return any(_calls(x, fn) for x in node)
    if isinstance(node, dict):
        return any(_calls(x, fn) for x in node.values())
    return False


def _bindable_models(exp: ir.Experiment, games: list[ir.Game]) -> list[str]:
    """Declared models a `bind` may choose: names in the parameters and literal bind values."""
    declared = {m.name for m in exp.models}
    found: list[str] = []

    def add(v: Any) -> None:
        if isinstance(v, str) and v in declared and v not in found:
            found.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                add(x)

    if any(_has_bind(g.body) for g in games):
        for p in exp.params:
            add(p.value)
        for g in games:
            _bind_literals(g.body, add)
    return found


def _has_bind(steps: list) -> bool:
    return any(s.kind == "bind" for s in all_steps(steps))


def _bind_literals(steps: list, add) -> None:
    for s in all_steps(steps):
        if s.kind == "bind" and s.model.kind == "lit":
            add(s.model.value)


def _frozen(exp: ir.Experiment, games: list[ir.Game], trained: str, others: list[str]):
    """vLLM servers (one per distinct weights), the agent's endpoint table and the README's
    rows, for every role the job's games ask besides the trained one."""
    servers: list[_Server] = []
    by_weights: dict[tuple[str, str | None], _Server] = {}
    endpoints: dict[str, dict] = {"roles": {}, "models": {}}
    rows: list[dict] = []

    def server_for(weights: str, ckpt_var: str | None, served: str, comment: str) -> _Server:
        s = by_weights.get((weights, ckpt_var))
        if s is None:
            s = by_weights[weights, ckpt_var] = _Server(FIRST_PORT + len(servers), served, weights, comment, ckpt_var)
            servers.append(s)
        return s

    for other in others:
        s = server_for(_weights(_role_model(exp, other)), f"CKPT_{other.upper()}", f"askspec-{other}",
                       f"trained role '{other}', frozen in this phase: its latest checkpoint")
        endpoints["roles"][other] = {"backend": "openai", "weights": s.served, "options": {"base_url": _url(s.port)}}
        rows.append({"role": other, "model": f"checkpoint of {other}", "endpoint": f"port {s.port} ({s.served})"})
    names = []
    for role in roles_asked(exp, games):
        if role == trained or role in others:
            continue
        name = exp.role(role).model
        rows.append({"role": role, "model": name or "bound per session", "endpoint": ""})
        if name and name not in names:
            names.append(name)
    for name in _bindable_models(exp, games):
        if name not in names:
            names.append(name)
    for name in names:
        m = exp.model(name)
        if m is None:
            continue
        if m.backend in HF_WEIGHTS_BACKENDS:
            s = server_for(_weights(m), None, m.weights, f"weights {m.weights}")
            endpoints["models"][name] = {"backend": "openai", "weights": s.served, "options": {"base_url": _url(s.port)}}
            where = f"port {s.port} ({s.served})"
        else:
            options = dict(m.options)  # spec option names -> backend options, as `askspec run` maps them
            if "concurrency" in options:
                options["max_concurrency"] = options.pop("concurrency")
            if "retries" in options:
                options["attempts"] = int(options.pop("retries")) + 1
            endpoints["models"][name] = {"backend": m.backend, "weights": m.weights, "options": options}
            where = f"{m.backend} ({m.options.get('base_url', m.weights)})"
        for row in rows:
            if row["model"] == name:
                row["endpoint"] = where
    bindable = ", ".join(f"{n} ({endpoints['models'][n]['options'].get('base_url', n)})".replace("{host}", "HOST")
                         for n in _bindable_models(exp, games) if n in endpoints["models"])
    for row in rows:
        if row["model"] == "bound per session":
            row["endpoint"] = f"the bound model's: {bindable}" if bindable else "the bound model's endpoint"
    return servers, endpoints, rows


def _declared(exp: ir.Experiment, name: str) -> ir.Model:
    """The model declared as `name` (the checker resolved every model name the job serves)."""
    m = exp.model(name)
    assert m is not None, f"no model '{name}'"
    return m


def _role_model(exp: ir.Experiment, role: str) -> ir.Model:
    """The declared model of `role`, a role the job trains or serves from its checkpoint: the
    checker gives each such role a model of its own (only an untrained role is bound per session)."""
    name = exp.role(role).model
    assert name is not None, f"role '{role}' has no model of its own"
    return _declared(exp, name)


def _ask_max_tokens(step: ir.AskStep, role: str) -> int:
    """An ask's own `with sampling { max_tokens }` for `role` (the checker types it a number)."""
    v = step.sampling_for(role)["max_tokens"]
    assert not isinstance(v, list), v
    return int(v)


def _weights(m: ir.Model) -> str:
    """What vLLM and DeepSpeed load for `m`. A leading "-" would reach `vllm serve` and
    train_ppo_ray as an option rather than a model (no Hugging Face id starts with one);
    empty weights name no model."""
    weights = mapping.hf_id(m.weights)
    if not weights:  # the scripts refuse an empty PRETRAIN or CKPT_<ROLE> (docs/cluster.md, "Environment variables")
        raise JobError(f"model '{m.name}': empty weights, which vllm serve and train_ppo_ray cannot load; "
                       "name a Hugging Face id or a local path")
    if weights.startswith("-"):
        raise JobError(f"model '{m.name}': weights {escape.line(weights)} start with '-', which vllm serve and "
                       f"train_ppo_ray would read as an option; write a local path as ./{escape.line(weights)}")
    return weights


def _url(port: int) -> str:
    return f"http://{{host}}:{port}/v1"


# --------------------------------------------------------------------------------- write
def _environment() -> jinja2.Environment:
    """Fail-closed: every `{{ ... }}` goes through an escape.py filter or the render fails."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False, finalize=escape.finalize)
    env.filters.update(escape.FILTERS)
    return env


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise JobError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise JobError(f"{out} is not empty and was not written by askspec compile --target openrlhf; "
                       "give a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for entry in out.iterdir():  # an earlier job: replace what askspec wrote, keep ckpt/, runs/, logs/
            if entry.name in GENERATED or entry.name.startswith(("phase-", "stage-")):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        (out / MARKER).write_text("written by askspec compile --target openrlhf\n", encoding="utf-8")
    except OSError as e:
        raise JobError(f"cannot write {out}: {e.strerror or e}") from None


def _write(exp: ir.Experiment, res, plan: JobPlan, phases: list[_PhaseOut], spec_path: str, out: Path,
           substitutes: dict[str, str], overrides: dict[str, str]) -> None:
    try:  # every file in memory before `out` is touched: a refusal writes nothing
        files = _render_all(exp, plan, phases, spec_path, substitutes)
        files.update(_stage_texts(exp, plan, phases, spec_path, overrides))
        ehash = experiment_hash(exp)
        job_exp = _job_experiment(exp, spec_path)
        for p in phases:
            job = jobfile.PhaseJob(
                format=jobfile.FORMAT, experiment=job_exp.model_dump(mode="json"), experiment_hash=ehash,
                trained_role=p.role, group=p.group, games=p.games, siblings=p.phase.siblings,
                seed=int(exp.options.get("seed", 0) or 0), endpoints=jobfile.Endpoints.model_validate(p.endpoints),
                spec_files=res.files, replay=p.replay,
                extension=_extension(p, plan),  # what the phase's askspec_ext installs (askspec_ext/pinned.py)
                sample_calls=p.phase.sample_calls,
                # the agent asks the job's service (inner_loop.py) for R_k
                inner_loop=jobfile.InnerLoop(service=_service_name(exp), role=p.phase.inner_loop, games=p.games)
                if p.phase.inner_loop is not None else None,
                draw=p.draw)
            elements = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in p.lines)
            if p.draw is not None:  # driver.sh writes prompts.jsonl from them when the phase starts
                files[os.path.join(p.dir, "elements.jsonl")] = elements
                elements = ""
            files[os.path.join(p.dir, jobfile.FILE)] = job.text()
            files[os.path.join(p.dir, "prompts.jsonl")] = elements
        blobs = {path: text.encode("utf-8") for path, text in files.items()}
    except UnicodeEncodeError as e:  # a data set's lone "\udcff", a --set value's undecodable byte
        raise JobError(f"the spec's data or parameters hold {e.object[e.start:e.end]!r}, which is not valid UTF-8: "
                       "fix the data file or the --set value") from None
    _prepare(out)
    try:
        # the phases' agents read the spec's data; an evaluate stage's `askspec run` the spec itself
        for folder in [p.dir for p in phases] + [s.dir for s in plan.stages if s.stage.kind == "evaluate" or s.askspec]:
            (out / folder).mkdir(parents=True, exist_ok=True)
            _copy_spec(exp, res, spec_path, out / folder / "spec")
        for path, blob in blobs.items():
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_bytes(blob)
            if path.endswith(".sh"):
                (out / path).chmod(0o755)
    except OSError as e:
        raise JobError(f"cannot write {out}: {e.strerror or e}") from None


def _render_all(exp: ir.Experiment, plan: JobPlan, phases: list[_PhaseOut], spec_path: str,
                substitutes: dict[str, str]) -> dict[str, str]:
    """The templated files of the job, by path inside the job folder. Every value reaches
    them through escape.py (the environment refuses anything else)."""
    env = _environment()
    common = {"experiment": exp.name, "hash12": experiment_hash(exp)[:12]}
    extensions = {p.dir: _extension(p, plan) for p in phases}
    texts = {}
    try:
        for p in phases:
            estimator, loss = mapping.openrlhf_algorithm(p.algorithm, p.phase.training.written())
            ctx = {**common, "role": p.role, "pretrain": p.pretrain, "flags": p.flags,
                   "root": os.path.relpath(".", p.dir),  # the job's folder, from the phase's
                   "algorithm_text": _algorithm_text(p),
                   "with_ref": any(f == "--algo.kl.init_coef" and float(v[0]) > 0 for f, v in p.flags),
                   "with_critic": estimator == "gae", "servers": p.servers,
                   "extension": bool(extensions[p.dir]),
                   "inner_loop": p.phase.inner_loop is not None, "gpus": p.gpus,
                   "gpus_why": f"the most GPUs, up to {mapping.ACTOR_GPUS}, a step's batch fits (world_check.py)"}
            ctx["train_entry"] = "askspec_ext.train_ppo_ray" if ctx["extension"] else "openrlhf.cli.train_ppo_ray"
            # a grounded nested schedule's job starts through askspec_nested.py, which starts the service
            ctx["entry"] = "askspec_nested" if ctx["inner_loop"] else ctx["train_entry"]
            if ctx["inner_loop"]:
                texts[os.path.join(p.dir, "askspec_nested.py")] = env.get_template("askspec_nested.py.j2").render(**ctx)
            if ctx["extension"]:  # launch.sh runs `python3 -m askspec_ext.train_ppo_ray` (docs/cluster.md)
                for source in sorted(_EXTENSION.glob("*.py")):
                    texts[os.path.join(p.dir, "askspec_ext", source.name)] = source.read_text(encoding="utf-8")
            for name in ("agent.py", "launch.sh", "serve_frozen.sh"):
                texts[os.path.join(p.dir, name)] = env.get_template(name + ".j2").render(**ctx)
            # launch.sh's check of the batch sizes against the real actor GPUs, stdlib only (world.py)
            texts[os.path.join(p.dir, "world_check.py")] = Path(world.__file__).read_text(encoding="utf-8")
        rl = [p for p in phases if any(p.phase is q for q in plan.phases)]  # the schedule's (not a retrain's)
        retrains = {p.phase.dir: p for p in phases if p not in rl}
        order = [{"kind": s.stage.kind, "name": s.stage.name, "dir": s.dir, "role": s.role, "askspec": s.askspec,
                  "frozen_trained": retrains[s.dir].frozen_trained if s.dir in retrains else []}
                 for s in plan.stages] or [{"kind": "train"}]
        inner = _inner_role(exp)  # a nested schedule's inner role: its weights are the service's (or initial)
        roles = [p.role for p in rl] + ([inner] if inner else [])
        pretrain = {p.role: p.pretrain for p in rl}
        if inner:
            pretrain[inner] = _weights(_role_model(exp, inner))
        ctx = {**common, "phases": rl, "iterations": plan.iterations, "phase_names": [p.dir for p in rl],
               "extensions": {p.dir: extensions[p.dir] for p in rl}, "carry_flags": carry.FLAGS,
               "carried_roles": list(dict.fromkeys(p.role for p in rl if extensions[p.dir].get("carry_state"))),
               "roles": roles, "pretrain": pretrain, "order": order,
               "inner_loop": inner if any(p.phase.inner_loop for p in rl) else None,
               "inner_keep_best": any((s.options.get("keep") or {}).get("rule") == "best" for s in exp.stages),
               "stage_jobs": plan.stages, "spec_name": os.path.basename(spec_path), "askspec_version": __version__,
               "lockstep": plan.lockstep,
               "substitutes": [f"{a}={b}" for a, b in sorted(substitutes.items())]}
        if plan.lockstep:  # the roles stepped together in one Ray job (multi.py), not phases in turn
            texts.update(multi.texts(env, common, plan, rl, {p.role: _algorithm_text(p) for p in rl},
                                     {p.role: extensions[p.dir] for p in rl}))
            for source in sorted(_EXTENSION.glob("*.py")):  # multi_policy.py, which askspec_multi.py runs
                texts[os.path.join("askspec_ext", source.name)] = source.read_text(encoding="utf-8")
        elif plan.driven:
            texts["driver.sh"] = env.get_template("driver.sh.j2").render(**ctx)
        texts["README.md"] = env.get_template("README.md.j2").render(**ctx) + (multi.readme(plan, rl) if plan.lockstep
                                                                               else "")
    except escape.Unrepresentable as e:
        raise JobError(f"cannot write the job: {e}") from None
    except multi.Refused as e:
        raise JobError(str(e)) from None
    return texts


def _algorithm_text(p: _PhaseOut) -> str:
    estimator, loss = mapping.openrlhf_algorithm(p.algorithm, p.phase.training.written())
    return f"{p.algorithm}: {estimator} advantages, {loss} loss" + (f"; substituted for {p.substituted}"
                                                                     if p.substituted else "")


def _stage_texts(exp: ir.Experiment, plan: JobPlan, phases: list[_PhaseOut], spec_path: str,
                 overrides: dict[str, str]) -> dict[str, str]:
    """The files of the sft and evaluate stages and of the retrain stages askspec's trainer
    runs (stages.py), by path inside the job folder."""
    env = _environment()
    # `askspec compile --data NAME=FILE`: the stages' `askspec run` reads the same files (absolute, as the agent does)
    common = {"experiment": exp.name, "hash12": experiment_hash(exp)[:12],
              "data_files": [f"{d.name}={d.path}" for d in exp.datasets if d.user_file]}
    seed = int(exp.options.get("seed", 0) or 0)
    by_role = {p.role: p for p in phases if any(p.phase is q for q in plan.phases)}
    texts: dict[str, str] = {}
    datasets = _datasets(exp, spec_path) if any(s.stage.kind == "sft" for s in plan.stages) else {}
    try:
        for job in plan.stages:
            if job.askspec:
                assert job.role is not None
                inner = _inner_role(exp)
                trained = [*by_role, *([inner] if inner else [])]
                pretrain = {r: by_role[r].pretrain if r in by_role else _weights(_role_model(exp, r))
                            for r in trained}
                profile = exp.options.get("profile")
                texts.update(stages.retrain_files(env, common, job, [r for r in trained if r != job.role], pretrain,
                                                  os.path.basename(spec_path), str(profile) if profile else None,
                                                  overrides))
                continue
            if job.role is None or job.stage.kind not in ("sft", "evaluate"):
                continue
            p = by_role.get(job.role)
            if p is None and job.stage.kind == "sft":
                raise JobError(f"stage '{job.stage.name}': an sft stage of '{job.role}', the nested schedule's inner "
                               "role, is not part of the job (its weights are the inner-loop service's)")
            if job.stage.kind == "sft":
                assert p is not None
                max_len = int(next(v[0] for f, v in p.flags if f == "--data.max_len"))
                texts.update(stages.sft_files(env, common, job, p.phase.training, stages.sft_records(job, datasets),
                                              p.pretrain, max_len, seed))
            else:
                # the inner role of a nested schedule has no phase: its initial weights are its model's
                initial = p.pretrain if p is not None else _weights(_role_model(exp, job.role))
                server = _Server(stages.EVAL_PORT, f"askspec-{job.role}", initial,
                                 f"the evaluated weights of '{job.role}' (CKPT_{job.role.upper()}, else the initial)",
                                 f"CKPT_{job.role.upper()}")
                profile = exp.options.get("profile")
                texts.update(stages.evaluate_files(env, common, job, server, initial, os.path.basename(spec_path),
                                                   str(profile) if profile else None, overrides,
                                                   _evaluation_servers(exp, job.frozen, server.port + 1),
                                                   [(name, _declared(exp, name).weights, url)
                                                    for name, url in job.endpoints.items()]))
    except stages.StageError as e:
        raise JobError(str(e)) from None
    except escape.Unrepresentable as e:
        raise JobError(f"cannot write the job: {e}") from None
    return texts


def _evaluation_servers(exp: ir.Experiment, models: list[str], port: int) -> list[tuple[str, _Server]]:
    """(model, its server) for the frozen models an evaluate stage serves beside the
    evaluated weights: one vLLM server per distinct weights, from `port` on, each serving
    them under their own name (the weights), as a phase's frozen servers do."""
    out: list[tuple[str, _Server]] = []
    by_weights: dict[str, _Server] = {}
    for name in models:
        m = _declared(exp, name)
        weights = _weights(m)
        if weights not in by_weights:
            by_weights[weights] = _Server(port + len(by_weights), m.weights, weights, f"weights {m.weights}")
        out.append((name, by_weights[weights]))
    return out


def _inner_role(exp: ir.Experiment) -> str | None:
    """A nested schedule's inner role (the job's inner-loop service trains it, or nothing does)."""
    sched = exp.schedule
    return str(sched.options["inner"]) if sched is not None and sched.kind == "nested" else None


def _service_name(exp: ir.Experiment) -> str:
    """The Ray name of the job's inner-loop service (inner_loop.run_job starts it, the agent finds it)."""
    return f"askspec-inner-loop-{experiment_hash(exp)[:12]}"


def _copy_spec(exp: ir.Experiment, res, spec_path: str, dest: Path) -> None:
    """Copy the spec, its prompt files and the data files inside its folder."""
    spec_dir = Path(os.path.abspath(spec_path)).parent
    for rel, text in res.files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for d in exp.datasets:
        if not d.path:
            continue
        rel = os.path.normpath(d.path)
        if os.path.isabs(rel) or rel.startswith(".."):
            continue  # _job_experiment points the agent at it where it is
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec_dir / d.path, dest / rel)


def _job_experiment(exp: ir.Experiment, spec_path: str) -> ir.Experiment:
    """The IR the agent loads: data paths that leave the spec's folder become absolute
    (the others are copied into spec/ beside the spec)."""
    spec_dir = Path(os.path.abspath(spec_path)).parent
    job_exp = exp.model_copy(deep=True)
    for d in job_exp.datasets:
        if d.path and (os.path.isabs(d.path) or os.path.normpath(d.path).startswith("..")):
            d.path = str((Path(d.path) if os.path.isabs(d.path) else spec_dir / d.path).resolve())
    return job_exp
