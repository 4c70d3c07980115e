"""The steps of the non-RL stages (docs/training.md, "Stages"), for the local trainer:

- `sft`: a batch of prompt/completion records becomes trajectories of one turn each (the
  prompt through the role's chat template as context, the completion and the end-of-turn
  token as the only trained tokens), trained with the sft loss (cross-entropy on the
  completion tokens) by the role's own policy and optimizer;
- `evaluate`: every element of the stage's games, `samples` times, once per weights
  (`trained`: the weights as the stages before left them; `initial`: the spec's own);
  `askspec metrics` reports pass@k / avg@n over those samples per stage from the recorded
  sessions (askspec.runtime.engine.passk);
- `retrain`: at its first step the `sample` game (if any) is played once by the weights
  the stages before left, its `sample N ask` replies becoming items as a nested schedule's
  datasets do (SOAR's teacher evaluations); then the role goes back to the spec's weights
  with a fresh AdamW (a fresh student, SOAR's PQ evaluation); each step plays the stage's
  game over the items (the promoted datasets' and the sampled ones, and/or a data set's,
  mixed, or the former first for `curriculum` steps), sized by the role's train block, and
  updates the role with its algorithm under the stage's learning-rate schedule. With
  `keep = plateau(reward, window, fraction)` the stage stops at the first step its smoothed
  training reward levels off (`plateau`), keeping that step's weights; with `select =
  posthoc` it trains every step, keeping the role's weights every `every` steps, and then
  selects the start of the plateau over the whole curve (`plateau_posthoc`, App. B.6), the
  evaluate stages after it averaging over the kept checkpoints of the `average` steps
  from it (`averaged_checkpoints`).
"""

from __future__ import annotations

from typing import Any

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan, derive_seed
from askspec.runtime.train.batch import Trajectory, Turn

# ---------------------------------------------------------------------------------------
# sft


def sft_batch(records: list[Any], opts: dict[str, Any], n: int) -> list[tuple[int, dict]]:
    """The `n`-th (1-based) step's records: `batch` of them in order, cycling."""
    if not records:
        raise ValueError(f"sft data set '{opts['data']}' is empty")
    size = int(opts["batch"])
    start = (n - 1) * size
    return [((start + j) % len(records), records[(start + j) % len(records)]) for j in range(size)]


def sft_trajectories(tokenizer: Any, chat_template: str | None, end_id: int, records: list[tuple[int, dict]],
                     opts: dict[str, Any], step: int, context: int | None = None) -> list[Trajectory]:
    """One single-turn trajectory per record. Loss mask: exactly the completion's tokens
    and the end-of-turn token after them (what the model must learn to produce). A record
    longer than the model's `context` (tokens) is refused, never cut: a cut completion
    would teach the model to stop mid-answer."""
    out = []
    for index, rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get(opts["prompt"]), str) \
                or not isinstance(rec.get(opts["completion"]), str):
            raise ValueError(f"sft data set '{opts['data']}', record {index + 1}: needs string fields "
                             f"'{opts['prompt']}' and '{opts['completion']}'")
        system = opts.get("system")
        if system is not None and not isinstance(rec.get(system), str):
            raise ValueError(f"sft data set '{opts['data']}', record {index + 1}: needs a string field '{system}' "
                             f"(the stage's system prompt field)")
        prompt_ids = chat_prompt_ids(tokenizer, chat_template, rec[opts["prompt"]],
                                     rec[system] if system is not None else None)
        completion_ids = list(tokenizer(rec[opts["completion"]], add_special_tokens=False)["input_ids"]) + [end_id]
        if context is not None and len(prompt_ids) + len(completion_ids) > context:
            raise ValueError(f"sft data set '{opts['data']}', record {index + 1}: {len(prompt_ids):,} prompt + "
                             f"{len(completion_ids):,} completion tokens, more than the model's context of "
                             f"{context:,}: shorten it or leave it out of the data set")
        key = f"sft-t{step:06d}-r{index:06d}"
        turn = Turn(session_id=key, attempt=1, turn_index=0, prompt_ids=prompt_ids, completion_ids=completion_ids,
                    logprobs=[], temperature=1.0, finish_reason="stop")
        out.append(Trajectory(key=key, group_key=key, reward=None, turns=[turn]))
    return out


def chat_prompt_ids(tokenizer: Any, chat_template: str | None, prompt: str, system: str | None = None) -> list[int]:
    """The prompt as the hf backend encodes a request of one user message, after the
    system prompt when there is one (the role's own, so the cold start trains the format
    the role is called in), generation prompt added."""
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": True}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": prompt}]
    encoded = tokenizer.apply_chat_template(messages, **kwargs)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def sft_config(cfg: Any, opts: dict[str, Any]) -> Any:
    """The role's train config as an sft stage runs it: the sft loss, the stage's lr
    (default the role's), constant, one epoch, no KL."""
    return cfg.model_copy(update=dict(algorithm="sft", estimator=None, loss="sft", aggregation="token", min_reward=None,
                                      lr=float(opts.get("lr") or cfg.lr), warmup=0, decay="constant", epochs=1, kl=0.0))


# ---------------------------------------------------------------------------------------
# evaluate


def eval_plans(stage: ir.Stage, elements: list, seed: int, step: int, index0: int, weights: list[str] | None = None,
               tag: str = "") -> dict[str, list[SessionPlan]]:
    """Per weights (the stage's, or those of `weights`), the sessions of an evaluate stage:
    every element `samples` times, its groups' ids ending in `tag` (a checkpoint of a
    post-hoc plateau's window: each checkpoint's samples are a group of their own, so
    pass@k averages over checkpoints and items alike). Both
    weights play the same seeds (a paired comparison: the one seed the spec shares, by
    asking for both weights); another evaluate stage of the same games has seeds of its
    own (the stage's name is part of them). `step` is not: `askspec run --eval-only
    --stage NAME` plays the stage alone under the seeds a training run gives it."""
    samples = int(stage.options["samples"])
    out: dict[str, list[SessionPlan]] = {}
    k = index0
    for w in weights or stage.options["weights"]:
        plans = out.setdefault(w, [])
        for j, e in enumerate(elements):
            group_id = f"{stage.name}-{w}{tag}-e{j:03d}"
            for member in range(samples):
                plans.append(SessionPlan(index=k, session_id=f"s{k:06d}", game=e.game.name, group_id=group_id,
                                         group_size=samples, bindings=e.bindings, step=step, stage=stage.name,
                                         weights=w,
                                         seed=derive_seed(seed, e.game.name, e.item_index, "evaluate", stage.name, member),
                                         item_index=e.item_index))
                k += 1
    return out


# ---------------------------------------------------------------------------------------
# retrain


def retrain_items(opts: dict[str, Any], promotions: list[dict], datasets: dict[str, list], n: int,
                  sampled: list[dict] | None = None) -> tuple[list, int]:
    """(the items the `n`-th step plays over, that step's number within its part): the
    promoted datasets' items (in promotion order), the sampled ones and the data set's,
    mixed; with `curriculum` C, the promoted and sampled items alone for steps 1..C, then
    the data set's."""
    promoted = [dict(it) for p in promotions for it in p.get("items") or []] if opts["promoted"] else []
    synthetic = promoted + [dict(it) for it in sampled or []]
    data = list(datasets.get(opts["data"]) or []) if opts["data"] else []
    c = int(opts.get("curriculum") or 0)
    if c:
        return (synthetic, n) if n <= c else (data, n - c)
    return synthetic + data, n


def sample_plans(stage: ir.Stage, elements: list, seed: int, step: int, index0: int) -> list[SessionPlan]:
    """The sessions of a retrain stage's `sample` game: every element once per session of
    its group (a `times N` game plays N)."""
    plans = []
    k = index0
    for j, e in enumerate(elements):
        for member in range(e.size):
            plans.append(SessionPlan(index=k, session_id=f"s{k:06d}", game=e.game.name,
                                     group_id=f"{stage.name}-sample-e{j:03d}", group_size=e.size, bindings=e.bindings,
                                     step=step, stage=stage.name,
                                     seed=derive_seed(seed, e.game.name, e.item_index, "sample", stage.name, member),
                                     item_index=e.item_index))
            k += 1
    return plans


def sampled_items(game: ir.Game, sessions: list, parsed: dict[tuple[str, int], Any]) -> list[dict]:
    """A `sample` game's items: every reply of its `sample N ask ROLE` calls, in session
    order, that the game did not drop (askspec.runtime.train.nested.datasets_of, the one
    reading of a sampled dataset)."""
    from askspec.ir.walk import all_steps
    from askspec.runtime.train.nested import datasets_of

    roles = sorted({r for st in all_steps(game.body) if isinstance(st, ir.AskStep) and st.sample is not None
                    for r in st.roles})
    return [it for role in roles for ds in datasets_of(sessions, parsed, role) for it in ds.items]


def _slopes(rewards: list[float | None], window: int, centred: bool) -> list[tuple[int, float, float]]:
    """(step, smoothed value, slope) of a stage's training-reward curve (one mean per step,
    step n at index n - 1; None: a step without rewards, left out): the curve smoothed by a
    moving average over `window` steps, trailing (the value at a step averages it and the
    window - 1 before) or centred (App. B.6: the steps around it; only whole windows), and
    each slope the smoothed value minus the one before, at the later one's step. The
    paper's normalisation by the reward range divides every slope alike, so it is left out."""
    curve = [(n, r) for n, r in enumerate(rewards, 1) if r is not None]
    before = (window - 1) // 2 if centred else window - 1  # of the window, the steps before its own
    smooth = [(curve[i][0], sum(r for _, r in curve[i - before:i - before + window]) / window)
              for i in range(before, len(curve) - (window - 1 - before))]
    return [(n, b, b - a) for (_, a), (n, b) in zip(smooth, smooth[1:])]


def plateau(rewards: list[float | None], window: int, fraction: float, min_steps: int = 0) -> dict[str, float] | None:
    """`keep = plateau(...)` online (`select = online`): whether the curve has levelled off
    at its last step, so the stage stops there: the slope of the curve smoothed by a
    trailing window (decided when the step is reached) below `fraction` of the largest
    slope so far, which must be positive (a curve that never rose has no plateau), and not
    before stage step `min_steps` (a guard: a noisy curve's first slopes make an early,
    small "largest slope"). Returns the slopes when it has, else None."""
    slopes = _slopes(rewards, window, centred=False)
    if len(slopes) < 2 or len(rewards) < min_steps:  # two slopes at least: one to rise, one to level off
        return None
    top = max(s for _, _, s in slopes[:-1])
    n, smoothed, last = slopes[-1]
    if top <= 0 or last >= fraction * top:
        return None
    return {"slope": last, "max_slope": top, "smoothed": smoothed}


def plateau_posthoc(rewards: list[float | None], window: int, fraction: float) -> dict[str, Any]:
    """`keep = plateau(..., select = posthoc)`: SOAR's checkpoint selection (App. B.6), over
    the whole recorded curve after the stage trained every step: smoothed by a centred
    window, "the earliest point where the normalized slope falls below 15% of the maximum
    observed slope" (`fraction`), read as the first step after the steepest rise whose
    slope is below `fraction` of it (before the rise every slope of a flat start is
    below it too, and the plateau is what follows the rise). {"step": the selected stage
    step, "slope", "max_slope", "max_step", "smoothed"}; "step" is the curve's last step
    (and "plateau" False) when no slope is positive or none after the steepest falls
    below `fraction` of it."""
    slopes = _slopes(rewards, window, centred=True)
    last = len(rewards)
    if not slopes or max(s for _, _, s in slopes) <= 0:
        return {"step": last, "plateau": False, "max_slope": max((s for _, _, s in slopes), default=None)}
    top_at = max(range(len(slopes)), key=lambda i: (slopes[i][2], -i))  # the first steepest
    top_step, _, top = slopes[top_at]
    for n, smoothed, slope in slopes[top_at + 1:]:
        if slope < fraction * top:
            return {"step": n, "plateau": True, "slope": slope, "max_slope": top, "max_step": top_step,
                    "smoothed": smoothed}
    return {"step": last, "plateau": False, "max_slope": top, "max_step": top_step}


def averaged_checkpoints(kept: list[int], selected: int, average: int, last: int) -> list[int]:
    """The checkpoints (stage steps) a post-hoc plateau's evaluations average over: the
    kept ones from the selected step through `average` steps after it (App. B.6: "test
    performance is averaged over a 200 step window following the selected step"); the
    first kept one after the selected step when none is in that window; the stage's last
    step (always kept) when none is after it."""
    window = [n for n in kept if selected <= n <= selected + average]
    return window or [next((n for n in sorted(kept) if n >= selected), last)]


def retrain_config(cfg: Any, opts: dict[str, Any]) -> Any:
    """The role's train config as a retrain stage runs it: its algorithm and sizes, the
    stage's steps (the learning-rate schedule's length), warm-up and lr (default the role's)."""
    return cfg.model_copy(update=dict(steps=int(opts["steps"]), warmup=int(opts.get("warmup", cfg.warmup)),
                                      lr=float(opts.get("lr") or cfg.lr)))
