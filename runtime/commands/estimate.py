"""`askspec estimate SPEC`: what a run of the spec will spend, before it runs.

Per stage, game and role: the model calls, prompt and completion tokens. Upper bounds
come from the plan alone: planned sessions (askspec.ir.plansize) × the game's call
bounds per session (`Game.call_bounds`, the checker's) and its routes' judge calls per
group (render.route_call_bounds), × each call's completion budget (`max_tokens`, the
engine's own rule: ir.merged_sampling) and, for a role that remembers
nothing and caps its prompt (`max_prompt_tokens`), × that cap. Expected values come from
a recorded run of the spec (`--from RUN`: its spending per session of each game, scaled
to this plan) or from a short pilot run (`--pilot N`). A train block adds its trained
tokens per step, its checkpoints' disk (train_report.checkpoint_disk, the trainer's rule)
and, for a named GPU size (`--gpu h100x8`), GPU-hours from the throughput assumptions of
docs/cluster.md ("Estimating a run"). `--from RUN` also shows what RUN spent beside the
bounds of its own sessions. `askspec check` prints the one-line summary (`summary_line`).
A session's bounds per role are bounds.py's (`session_bounds`), which `askspec run`'s
closing summary compares with what it spent.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

from askspec.ir import model as ir
from askspec.ir.plansize import (Unknown, dataset_sizes, first_phase, game_sessions, items_count,
                                 replays_buffer, training_step_sessions, training_steps, weight_rounds)
from askspec.ir.vocab import HF_WEIGHTS_BACKENDS
from askspec.terminal import printable

from askspec.runtime.commands.bounds import Cell, session_bounds, spent_vs_bounds, versus
from askspec.runtime.commands.bounds import count as _n
from askspec.runtime.commands.train_report import checkpoint_disk
from askspec.runtime.commands.options import UsageError, parse_pairs

# Throughput assumptions (docs/cluster.md, "Estimating a run", has the sources).
# Peak dense BF16 tensor FLOP/s per GPU (vendor datasheets, without sparsity).
GPU_PEAK_FLOPS = {"a100": 312e12, "h100": 989e12, "h200": 989e12, "b200": 2250e12, "l40s": 362e12}
TRAIN_MFU = 0.40  # model FLOPs utilisation of the policy update (Megatron-LM, PaLM: 40-50 %)
GENERATE_MFU = 0.15  # of batched rollout generation (decoding is memory-bound; Pope et al. 2022)
FORWARD_FLOPS = 2  # per parameter and token: a forward pass (Kaplan et al. 2020, §2.1)
TRAIN_FLOPS = 6  # per parameter and token: forward + backward
# an RL update also scores the trained tokens with the sampling policy (one forward more),
# and with a KL term (kl > 0) with the reference model (another)
RL_EXTRA_FORWARDS = 1


@dataclass
class Row:
    stage: str
    game: str
    role: str
    sessions: int | None
    bound: Cell
    expected: Cell | None = None


@dataclass
class TrainLine:
    role: str
    stage: str
    steps: int
    step_sessions: int
    bound_tokens: float | None  # the trained role's completion tokens of one step, at most
    expected_tokens: float | None
    checkpoint: tuple[int, int, float, float] | None  # checkpoint_disk(...) or None (weights' size unknown)


@dataclass
class Estimate:
    rows: list[Row] = field(default_factory=list)
    training: list[TrainLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: str | None = None  # the run the expected values come from

    def by_role(self) -> dict[str, tuple[Cell, Cell | None]]:
        """Per role: (bound, expected) summed over every stage and game."""
        out: dict[str, tuple[Cell, Cell | None]] = {}
        for r in self.rows:
            bound, exp = out.get(r.role, (Cell(), Cell() if r.expected is not None else None))
            bound.add(r.bound)
            if exp is not None and r.expected is not None:
                exp.add(r.expected)
            elif r.expected is None:
                exp = None
            out[r.role] = (bound, exp)
        return out


# ---------------------------------------------------------------------- the plan's stages

def _planned(game: ir.Game, params: dict[str, Any], sizes: dict[str, int]) -> int | None:
    try:
        return game_sessions(game, params, sizes)
    except Unknown:
        return None


def _items(game: ir.Game, params: dict[str, Any], sizes: dict[str, int]) -> int | None:
    try:
        return (1 if game.iter is None else items_count(game.iter, params, sizes)) * game.times
    except Unknown:
        return None


def stage_sessions(exp: ir.Experiment, eval_only: bool = False,
                   sizes: dict[str, int] | None = None) -> list[tuple[str, dict[str, int | None]]]:
    """(stage, sessions per game) in the order a run plays them: an evaluation run's games;
    a training schedule's steps × sessions per step, spread over its games as their plans
    are; an evaluate stage's items × samples × weights; a retrain stage's steps × batch.
    None: a count only the run knows (a data file not read, a buffer). `sizes`: the data
    sets' lengths where known (default: the inline ones, plansize.dataset_sizes)."""
    params, sizes = exp.param_values(), {**dataset_sizes(exp), **(sizes or {})}
    games = {g.name: g for g in exp.games}
    out: list[tuple[str, dict[str, int | None]]] = []
    if eval_only or not exp.training:
        plan: dict[str, int | None] = {g.name: _planned(g, params, sizes) for g in first_phase(exp)}
        plan.update({g.name: None for g in exp.games if replays_buffer(g) is not None})
        return [("eval", plan)]
    stages = exp.stages or [ir.Stage(name="train", kind="train")]
    for st in stages:
        o = st.options
        if st.kind == "train":
            out.append((st.name, _training_sessions(exp, params, sizes)))
        elif st.kind == "evaluate":
            weights = weight_rounds(exp, st)  # each weights, a post-hoc plateau's checkpoints each
            counts = {}
            for name in o.get("games", []):
                n = _items(games[name], params, sizes)
                counts[name] = None if n is None else n * int(o.get("samples") or 1) * weights
            out.append((st.name, counts))
        elif st.kind == "retrain" and o.get("game") in games:
            phase = next((ph for ph in exp.train_phases() if ph.stage == st.name), None)
            per_step = phase.batch if phase is not None else 1
            out.append((st.name, {o["game"]: int(o.get("steps") or 1) * per_step}))
    return out


def _trained_games(exp: ir.Experiment) -> dict[str, list[ir.Game]]:
    """Per trained role, the games its steps play: an alternating schedule's phase of the
    role plays its own (and its buffers' replaying games: the IR's lowered phases);
    otherwise every role's steps play the schedule's games."""
    sched = exp.schedule
    if sched is not None and sched.kind == "alternating":
        named = {ph.name: {*ph.plain, *ph.replay} for ph in exp.train_phases() if ph.kind == "play"}
        return {t.role: [g for g in exp.games if g.name in named.get(t.role, ())] for t in exp.training}
    games = first_phase(exp)  # (the held-out games left out)
    chosen = sched.options.get("games") if sched is not None else None
    if isinstance(chosen, list):
        games = [g for g in exp.games if g.name in chosen]
    return {t.role: games for t in exp.training}


def _training_sessions(exp: ir.Experiment, params: dict[str, Any], sizes: dict[str, int]) -> dict[str, int | None]:
    """The sessions a training schedule plays, per game: online, every step plays the
    largest block's batch; alternating, each block's phases follow each other, each on its
    own games."""
    by_role = _trained_games(exp)
    totals = {t.role: training_steps(t, exp) * training_step_sessions(t, by_role[t.role]) for t in exp.training}
    if exp.schedule is None or exp.schedule.kind != "alternating":  # every step plays the largest batch
        role = max(totals, key=lambda r: totals[r], default=None)
        totals = {role: totals[role]} if role is not None else {}
    out: dict[str, int | None] = {}
    for role, total in totals.items():
        planned = {g.name: _planned(g, params, sizes) for g in by_role[role]}
        weights = {name: (n or 1) for name, n in planned.items()}
        whole = sum(weights.values()) or 1
        # the step's sessions cycle through the games' elements: a game's share is its plan's
        for name, w in weights.items():
            out[name] = (out.get(name) or 0) + math.ceil(total * w / whole)
    return out


# ---------------------------------------------------------------------- a recorded run's rates

@dataclass
class Rates:
    """What a recorded run spent per session of each game, per role."""

    sessions: dict[str, int]  # game -> sessions recorded
    spent: dict[tuple[str, str], Cell]  # (game, role) -> calls and tokens spent
    run_dir: str
    experiment_hash: str | None = None

    def per_session(self, game: str, role: str) -> Cell | None:
        n = self.sessions.get(game)
        c = self.spent.get((game, role))
        if not n:
            return None
        if c is None:
            return Cell()
        return Cell((c.calls or 0) / n, (c.prompt or 0) / n, (c.completion or 0) / n)


def read_rates(run_dir: str) -> Rates:
    """A run's calls and tokens per game and role (a group's judge calls go to its game),
    and its sessions per game, from the run store."""
    from askspec.runtime.store.views import open_store

    con = open_store(run_dir)
    sessions = dict(con.execute("SELECT game, count(*) FROM sessions GROUP BY game").fetchall())
    rows = con.execute("""
        SELECT coalesce(s.game, g.game) AS game, t.role, count(*), sum(coalesce(t.tokens_in, 0)),
               sum(coalesce(t.tokens_out, 0))
        FROM turns t
        LEFT JOIN sessions s ON t.session_id = s.session_id
        LEFT JOIN (SELECT group_id, any_value(game) AS game FROM sessions WHERE group_id IS NOT NULL
                   GROUP BY group_id) g ON t.group_id = g.group_id
        GROUP BY ALL""").fetchall()
    spent = {(game, role): Cell(float(n), float(tin), float(tout)) for game, role, n, tin, tout in rows
             if game is not None}
    row = con.execute("SELECT experiment_hash FROM runs").fetchone()
    return Rates(sessions={str(k): int(v) for k, v in sessions.items()}, spent=spent, run_dir=run_dir,
                 experiment_hash=row[0] if row else None)


# ---------------------------------------------------------------------- the estimate

def estimate(exp: ir.Experiment, rates: Rates | None = None, eval_only: bool = False,
             sizes: dict[str, int] | None = None) -> Estimate:
    est = Estimate(source=rates.run_dir if rates else None)
    games = {g.name: g for g in exp.games}
    for stage, plan in stage_sessions(exp, eval_only, sizes):
        for name, n in plan.items():
            game = games[name]
            for role, per in session_bounds(exp, game).items():
                bound = Cell(*(None if n is None or v is None else n * v for v in (per.calls, per.prompt, per.completion)))
                expected = None
                rate = rates.per_session(name, role) if rates else None
                if rate is not None and n is not None:
                    # never past the bound: a run cannot spend more than its plan allows
                    expected = Cell(*(_capped(n * (v or 0), b) for v, b in
                                      ((rate.calls, bound.calls), (rate.prompt, bound.prompt),
                                       (rate.completion, bound.completion))))
                est.rows.append(Row(stage, name, role, n, bound, expected))
            if n is None:
                est.notes.append(f"{stage}: game {name}'s sessions are counted only when the run reads its data "
                                 f"or buffer; its rows have no total")
    if not eval_only:
        est.training = _training_lines(exp, est, rates)
    if exp.schedule is not None and exp.schedule.kind == "nested":
        est.notes.append("the nested schedule's inner loop (students trained per dataset) is not counted")
    return est


def _capped(v: float, bound: float | None) -> float:
    return v if bound is None else min(v, bound)


def _training_lines(exp: ir.Experiment, est: Estimate, rates: Rates | None) -> list[TrainLine]:
    by_role = _trained_games(exp)
    stage = next((s.name for s in exp.stages if s.kind == "train"), "train")
    out = []
    for t in exp.training:
        games = by_role[t.role]
        per_step = training_step_sessions(t, games)
        mine = [g for g in games if t.role in g.call_bounds]
        bounds = [session_bounds(exp, g).get(t.role, Cell()).completion for g in mine]
        bound = None if not bounds or None in bounds else per_step * max(b or 0 for b in bounds)
        expected = None
        if rates is not None and mine:
            per = [rates.per_session(g.name, t.role) for g in mine]
            known = [p.completion or 0 for p in per if p is not None]
            if known:
                expected = _capped(per_step * sum(known) / len(known), bound)
        cfg = t.config
        ckpt = None
        size = _weights_bytes(exp, t.role)
        if cfg is not None and size is not None:
            steps = training_steps(t, exp)
            ckpt = checkpoint_disk({t.role: (size, 2 * size)}, steps, cfg.save_every, cfg.keep_checkpoints)
        out.append(TrainLine(t.role, stage, training_steps(t, exp), per_step, bound, expected, ckpt))
    return out


# ---------------------------------------------------------------------- model sizes

def _safetensors(path: str) -> tuple[int, int]:
    """(parameters, bytes) of the tensors in one .safetensors file, from its header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    params = nbytes = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        params += math.prod(t["shape"])
        nbytes += t["data_offsets"][1] - t["data_offsets"][0]
    return params, nbytes


def _weights_folder(weights: str) -> str | None:
    if os.path.isdir(weights):
        return weights
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(weights, local_files_only=True)
    except Exception:  # not in the local cache (or not a hub id): the size is unknown
        return None


def model_size(model: ir.Model | None) -> tuple[int, int] | None:
    """(parameters, bytes as stored) of a model's weights: read from the headers of its
    local .safetensors files (an hf/vllm model), else a size in its name ("Qwen3-8B": 8e9
    parameters, 2 bytes each), else None."""
    if model is None:
        return None
    if model.backend in HF_WEIGHTS_BACKENDS:
        folder = _weights_folder(model.weights)
        files = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".safetensors")] if folder else []
        if files:
            sizes = [_safetensors(f) for f in files]
            return sum(p for p, _ in sizes), sum(b for _, b in sizes)
    m = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([BbMm])(?![a-zA-Z])", model.weights)
    if m:
        params = int(float(m.group(1)) * (1e9 if m.group(2) in "Bb" else 1e6))
        return params, 2 * params
    return None


def _role_model(exp: ir.Experiment, role: str) -> ir.Model | None:
    r = next((r for r in exp.roles if r.name == role), None)
    return exp.model(r.model) if r and r.model else None


def _weights_bytes(exp: ir.Experiment, role: str) -> int | None:
    size = model_size(_role_model(exp, role))
    return size[1] if size else None


# ---------------------------------------------------------------------- GPU-hours

def parse_gpu(text: str) -> tuple[str, int]:
    """`h100x8` -> ("h100", 8); `h100` -> ("h100", 1). ValueError names the known GPUs."""
    m = re.fullmatch(r"([a-z0-9]+?)(?:x(\d+))?", text.strip().lower())
    if not m or m.group(1) not in GPU_PEAK_FLOPS or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ValueError(f"--gpu {text!r}: expected NAME or NAMExCOUNT, NAME one of {', '.join(GPU_PEAK_FLOPS)} "
                         f"(e.g. h100x8)")
    return m.group(1), int(m.group(2) or 1)


def gpu_hours(exp: ir.Experiment, est: Estimate, gpu: str, count: int) -> tuple[float, list[str]]:
    """GPU-hours of the estimate on `gpu`: generation at FORWARD_FLOPS per parameter and
    token (prompt and completion) and GENERATE_MFU; the trained roles' tokens once more at
    TRAIN_FLOPS (+ RL_EXTRA_FORWARDS forwards, + one for a KL term's reference) and TRAIN_MFU. Expected tokens where known,
    else the bounds (completion tokens alone where the prompts have no bound). Roles whose
    model size is unknown are named and left out."""
    peak = GPU_PEAK_FLOPS[gpu]
    trained = {t.role: t for t in exp.training}
    seconds, missing = 0.0, []
    for role, (bound, expected) in est.by_role().items():
        cell = expected or bound
        size = model_size(_role_model(exp, role))
        if size is None or cell.completion is None:
            missing.append(role)
            continue
        params = size[0]
        tokens = cell.tokens if cell.tokens is not None else cell.completion
        seconds += FORWARD_FLOPS * params * tokens / (peak * GENERATE_MFU)
        if role in trained:
            t = trained[role]
            reference = 1 if t.config is not None and t.config.kl > 0 else 0
            per_token = TRAIN_FLOPS + FORWARD_FLOPS * (RL_EXTRA_FORWARDS + reference)
            seconds += per_token * params * tokens / (peak * TRAIN_MFU)
    del count  # GPU-hours do not depend on how many share them; the wall time does
    return seconds / 3600, missing


# ---------------------------------------------------------------------- printing

def render(exp: ir.Experiment, est: Estimate, gpu: tuple[str, int] | None = None) -> list[str]:
    lines = [f"estimate of {exp.name}" + (f" (expected values from {est.source})" if est.source else
                                          " (bounds only; --from RUN or --pilot N for expected values)")]
    titles = ["stage", "game", "role", "sessions", "calls ≤", "prompt ≤", "completion ≤"]
    if est.source:
        titles += ["calls ~", "prompt ~", "completion ~"]
    table = []
    for r in est.rows:
        cells = [r.stage, r.game, r.role, _n(r.sessions), _n(r.bound.calls), _n(r.bound.prompt), _n(r.bound.completion)]
        if est.source:
            e = r.expected
            cells += [_n(e.calls), _n(e.prompt), _n(e.completion)] if e else ["-", "-", "-"]
        table.append(cells)
    # each column as wide as its widest cell; names left-aligned, numbers right-aligned
    widths = [max(len(row[i]) for row in [titles, *table]) for i in range(len(titles))]
    for row in [titles, *table]:
        lines.append("  " + " ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    lines.append("  per role:")
    for role, (bound, expected) in est.by_role().items():
        text = (f"    {role}: calls ≤ {_n(bound.calls)}, prompt ≤ {_n(bound.prompt)}, "
                f"completion ≤ {_n(bound.completion)} tokens")
        if expected is not None:
            text += (f"; expected {_n(expected.calls)} calls, {_n(expected.prompt)} prompt + "
                     f"{_n(expected.completion)} completion tokens")
        lines.append(text)
    for t in est.training:
        text = (f"  train {t.role} ({t.stage}): {t.steps:,} step(s) × {t.step_sessions:,} session(s); trained "
                f"(completion) tokens per step ≤ {_n(t.bound_tokens)}")
        if t.expected_tokens is not None:
            text += f", expected {_n(t.expected_tokens)}"
        if t.checkpoint is not None:
            written, kept, final, peak = t.checkpoint
            text += (f"; checkpoints: {written:,} written, {kept:,} kept, {final / 1e9:,.1f} GB on disk at the end "
                     f"(up to {peak / 1e9:,.1f} GB while one is written)")
        else:
            text += "; checkpoint size unknown (the model's weights are not on this machine)"
        lines.append(text)
    if gpu is not None:
        hours, missing = gpu_hours(exp, est, *gpu)
        name, count = gpu
        text = (f"  GPU: {hours:,.2f} {name.upper()}-hours, about {hours / count:,.2f} h on {count} GPU(s) "
                f"(peak {GPU_PEAK_FLOPS[name] / 1e12:,.0f} TFLOP/s, generation at {GENERATE_MFU:.0%} and training "
                f"at {TRAIN_MFU:.0%} of it; docs/cluster.md)")
        if missing:
            text += f"; left out (model size unknown): {', '.join(missing)}"
        if not est.source:
            text += "; bounds, prompts uncounted where unbounded (--from or --pilot for expected tokens)"
        lines.append(text)
    lines += [f"  note: {n}" for n in est.notes]
    return [printable(line, single_line=True) for line in lines]


def compare_lines(exp: ir.Experiment, rates: Rates) -> list[str]:
    """What RUN spent per role beside this spec's bounds for RUN's own sessions (a bound a
    run passed would be a bug in the bounds)."""
    spent: dict[str, Cell] = {}
    for (game, role), c in rates.spent.items():
        if game in rates.sessions and any(g.name == game for g in exp.games):
            spent.setdefault(role, Cell()).add(c)
    lines = [f"spent by {rates.run_dir} ({sum(rates.sessions.values()):,} sessions) vs the bounds of those sessions:"]
    lines += [f"  {versus(role, *pair)}" for role, pair in spent_vs_bounds(exp, rates.sessions, spent).items()]
    return [printable(line, single_line=True) for line in lines]


def summary_line(exp: ir.Experiment) -> str:
    """`askspec check`'s line: the plan's bounds in calls and completion tokens."""
    est = estimate(exp)
    calls = completion = 0.0
    unknown = False
    for bound, _ in est.by_role().values():
        if bound.calls is None or bound.completion is None:
            unknown = True
            continue
        calls += bound.calls
        completion += bound.completion
    if unknown and not calls:
        return "model calls and tokens counted once the data is read: `askspec estimate` reads it"
    tail = " (some games' sessions are counted at run time)" if unknown else ""
    return f"at most {calls:,.0f} model calls, {completion:,.0f} completion tokens{tail}; `askspec estimate` for more"


# ---------------------------------------------------------------------- the command

def register(sub) -> None:
    p = sub.add_parser("estimate", help="estimate a run's model calls, tokens, checkpoint disk and GPU-hours",
                       description="Bounds on a run's model calls and tokens per stage, game and role, from the plan "
                                   "and max_tokens; expected values from a recorded run (--from) or a pilot (--pilot).")
    p.add_argument("file", help="the .ask spec")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter")
    p.add_argument("--profile", metavar="NAME", help="the configuration to estimate: one of the spec's profiles")
    p.add_argument("--data", action="append", metavar="NAME=FILE",
                   help="count data block NAME from FILE (JSON lines or parquet), as `askspec run --data` reads it")
    p.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                   help="expected values from this run of the spec (its spending per session); also shows what it spent")
    p.add_argument("--pilot", type=int, metavar="N", help="run N sessions first (the spec's own models) for expected values")
    p.add_argument("--gpu", metavar="NAMExCOUNT", help=f"GPU-hours on this GPU: {', '.join(GPU_PEAK_FLOPS)} (e.g. h100x8)")
    p.add_argument("--eval-only", action="store_true", help="estimate a run that plays the games without training")
    p.set_defaults(func=cmd_estimate)


def _err(message: str) -> int:
    print(printable(f"error: {message}", single_line=True), file=sys.stderr)
    return 1


def cmd_estimate(args) -> int:
    from askspec.api import compile_file

    overrides = {}
    for pair in args.set or []:
        if "=" not in pair:
            return _err(f"--set takes NAME=VALUE, got {pair!r}")
        k, v = pair.split("=", 1)
        overrides[k.strip()] = v.strip()
    try:
        data = parse_pairs(args.data, "--data", form="NAME=FILE")
    except UsageError as e:
        return _err(str(e))
    if args.from_run and args.pilot:
        return _err("--from and --pilot both give expected values: use one")
    if args.pilot is not None and args.pilot < 1:
        return _err("--pilot takes a whole number ≥ 1")
    gpu = None
    if args.gpu:
        try:
            gpu = parse_gpu(args.gpu)
        except ValueError as e:
            return _err(str(e))
    res = compile_file(args.file, overrides, args.profile, data=data)
    res.sink.emit(res.sources)
    if not res.ok or res.ir is None:
        return 1
    exp = res.ir
    rates = None
    run_dir = args.from_run
    if args.pilot:
        run_dir = _pilot(args, args.pilot, data)
        if run_dir is None:
            return 1
    if run_dir:
        if not os.path.isdir(run_dir):
            return _err(f"--from {run_dir}: no such run directory")
        rates = read_rates(run_dir)
        from askspec.ir.canonical import experiment_hash

        if args.from_run and rates.experiment_hash and rates.experiment_hash != experiment_hash(exp):
            print(printable(f"note: {run_dir} ran another version of the spec (or other --set/--profile); its "
                            f"spending per session is used as it is", single_line=True), file=sys.stderr)
    est = estimate(exp, rates, eval_only=args.eval_only, sizes=_data_sizes(exp, args.file))
    for line in render(exp, est, gpu):
        print(line)
    if args.from_run and rates is not None:
        for line in compare_lines(exp, rates):
            print(line)
    return 0


def _data_sizes(exp: ir.Experiment, spec_file: str) -> dict[str, int]:
    """The lengths of the spec's data files, read as a run reads them (engine.plan.load_dataset);
    a file that cannot be read is left uncounted (its games' rows say so)."""
    from askspec.runtime.engine.plan import load_dataset

    out = {}
    for d in exp.datasets:
        if d.path is None:
            continue
        try:
            out[d.name] = len(load_dataset(d, os.path.dirname(os.path.abspath(spec_file)), int(exp.options.get("seed") or 0)))
        except Exception:  # noqa: BLE001 - any unreadable file: the count stays unknown, as in `check`
            continue
    return out


def _pilot(args, n: int, data: dict[str, str]) -> str | None:
    """Run `n` sessions of the spec (its own models, no training) in a temporary folder."""
    import asyncio
    import tempfile

    from askspec.runtime.commands.run import run_spec

    out = tempfile.mkdtemp(prefix="askspec-pilot-")
    print(f"pilot: running {n} session(s) in {out}", file=sys.stderr)
    rc, run_dir = asyncio.run(run_spec(args.file, out=out, sessions=n, set=args.set, profile=args.profile,
                                       data=data, eval_only=True, quiet=True))
    if rc != 0 or run_dir is None:
        _err(f"the pilot run failed (exit {rc}); see {run_dir or out}")
        return None
    return run_dir
