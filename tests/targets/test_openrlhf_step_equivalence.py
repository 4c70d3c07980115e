"""One training step, job against local trainer, for every training profile of the seed
specs and for the tests' own cluster specs: the step each compiled job's launch line makes
of a batch of rollouts on OpenRLHF 0.11.2 (its own parser's args; its own
`_process_response_into_experience` for the masks, `compute_advantages_and_returns` with
the job's askspec_ext advantages hook for the advantages and returns, `PolicyLoss` built as
its PolicyModelActor builds it — CISPO and the truncated importance weight of
`max_staleness` through the job's extension — and `iter_grad_accum_global_norm` for the
loss normalisation) gives the per-token advantages and the loss the local trainer gives
the same rollouts (askspec.runtime.train.advantages and losses, with the block's lowered
settings), to 1e-6.

Each step has groups of the job's n rollouts with a dropped member (no action range,
`askspec_trained_turns` 0, as the agent returns a dropped, failed or unrewarded rollout or
a `drop` route's), uneven lengths, and, where the block has `max_staleness`, stale rows
(sampled by older weights: π_old ≠ μ). OpenRLHF's own advantage method, without the hook,
keeps the dropped member in its group: its advantages differ (the old behaviour). gae
(`ppo` with a critic) keeps OpenRLHF's own advantages and is left out (docs/cluster.md).
The agent's side — that its rollouts carry these masks, rewards and drops for a spec's
game — is test_openrlhf_equivalence.py's; a gated step takes no update
(test_openrlhf_gate.py)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

from askspec.cli import main
from askspec.ir import model as ir
from askspec.runtime.train.advantages import advantages as local_advantages
from askspec.runtime.train.losses import aggregate, importance_weights, policy_token_loss, row_weights

from openrlhf_harness import launch_argv, load_policy_loss, parse_train_ppo_ray, train_flags
from openrlhf_modules import experience_maker, experience_module, samples_generator
from test_openrlhf_every_job import CASES as SEED_CASES, REFUSED, ROOT
from test_openrlhf_population_std import maker

TEST_SPECS = Path(__file__).parent / "specs"
CASES = [(ROOT / "specs" / s, p) for s, p in SEED_CASES if (s, p) not in REFUSED] + \
        [(path, None) for path in sorted(TEST_SPECS.glob("*.ask"))]
GROUPS = 3  # prompts a step (the first has a dropped member)


def step_rollouts(n: int, stale: bool, seed: int) -> list[dict]:
    """GROUPS × n rollouts: reward, prompt and action lengths, the sampler's log-probs μ,
    π_old (μ on a fresh row; another where stale) and the new log-probs; member 1 of
    group 0 dropped (and, with n > 2, member 0 of group 2)."""
    rng = random.Random(seed)
    out = []
    for g in range(GROUPS):
        for m in range(n):
            prompt, actions = rng.randint(2, 4), rng.randint(1, 5)
            mu = [-rng.uniform(0.1, 2.0) for _ in range(actions)]
            is_stale = stale and rng.random() < 0.5
            old = [x + rng.uniform(-0.3, 0.3) for x in mu] if is_stale else list(mu)
            out.append({"group": g, "reward": round(rng.uniform(-1.0, 2.0), 3), "prompt": prompt,
                        "actions": actions, "mu": mu, "old": old, "new": [x + rng.uniform(-0.4, 0.4) for x in old],
                        "dropped": (g, m) == (0, 1 % n) or (n > 2 and (g, m) == (2, 0)), "stale": is_stale})
    return out


def response(r: dict) -> dict:
    """The agent's answer for a rollout, as OpenRLHF's generate_responses hands it on."""
    length = r["prompt"] + r["actions"]
    logprobs = [0.0] * r["prompt"] + r["mu"]
    return {"prompt": "p", "label": "{}", "observation_tokens": list(range(5, 5 + length)),
            "action_ranges": [] if r["dropped"] else [(r["prompt"], length)], "reward": r["reward"],
            "scores": r["reward"], "rollout_log_probs": logprobs, "truncated": False,
            "extra_logs": {"askspec_trained_turns": 0.0 if r["dropped"] else 1.0}}


def openrlhf_step(job: Path, args, rollouts: list[dict], register, job_module,
                  hooked: bool = True) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per rollout, its advantages at its action tokens; and the step's policy loss."""
    module, exp_module = experience_maker(register), experience_module(register)
    gen = samples_generator(register)
    if hooked:
        job_module(job, "advantages").install(module)
    process = gen.SamplesGenerator._process_response_into_experience
    samples = [process(object.__new__(gen.SamplesGenerator), response(r), max_len=64) for r in rollouts]
    width = max(s.action_mask.shape[1] for s in samples)
    for i, (s, r) in enumerate(zip(samples, rollouts)):
        s.index = [i]
        s.kl = torch.zeros_like(s.action_mask, dtype=torch.float32)
        at = torch.nonzero(s.action_mask[0]).flatten()  # the action tokens' places (OpenRLHF's shifted mask)
        for name, values in (("action_log_probs", r["old"]), ("_new", r["new"])):
            t = torch.zeros(1, s.action_mask.shape[1], dtype=torch.float64)
            if len(at):
                t[0, at] = torch.tensor(values, dtype=torch.float64)
            setattr(s, name, t)
        s.rollout_log_probs = s.rollout_log_probs.to(torch.float64)
    experiences = [exp_module.Experience.concat_experiences([s], 0) for s in samples]
    for e, s in zip(experiences, samples):
        e._new = s._new
    m = maker(module, args)
    experiences = m.compute_advantages_and_returns(experiences)
    adv = [e.advantages[0][e.action_mask[0].bool()] for e in experiences]

    def padded(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])

    mask = padded([e.action_mask for e in experiences])
    loss_mod = sys.modules["openrlhf.models.loss"]
    loss_fn = loss_mod.PolicyLoss(  # as PolicyModelActor builds it (trainer/ray/ppo_actor.py)
        clip_eps_low=args.actor.eps_clip_low_high[0], clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip, token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type, is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold)
    from openrlhf.utils.loss_utils import iter_grad_accum_global_norm

    ((_, info),) = list(iter_grad_accum_global_norm([mask], None, 1, lambda x: x))  # one window: the step
    loss = loss_fn(padded([e._new for e in experiences]), padded([e.action_log_probs for e in experiences]),
                   padded([e.advantages.to(torch.float64) for e in experiences]), action_mask=mask,
                   rollout_log_probs=padded([e.rollout_log_probs for e in experiences]), **info)[0]
    return adv, loss


def local_step(cfg: ir.TrainSettings, rollouts: list[dict]) -> tuple[dict[int, float], torch.Tensor]:
    """The local trainer's advantage per kept rollout and the step's loss (policy.update's
    calls: the estimator over the batch's trajectories, policy_token_loss with a stale
    row's ratio against π_old and its truncated importance weight, row_weights/aggregate)."""
    kept = [i for i, r in enumerate(rollouts) if not r["dropped"]]
    groups = {g: k for k, g in enumerate(dict.fromkeys(rollouts[i]["group"] for i in kept))}
    adv = local_advantages(cfg.estimator or "grpo",
                           torch.tensor([rollouts[i]["reward"] for i in kept], dtype=torch.float64),
                           torch.tensor([groups[rollouts[i]["group"]] for i in kept]),
                           torch.tensor([rollouts[i]["actions"] for i in kept], dtype=torch.float64), cfg.std)
    steps = max(rollouts[i]["actions"] for i in kept)
    logp, old, mu, mask = (torch.zeros(len(kept), steps, dtype=torch.float64) for _ in range(4))
    for row, i in enumerate(kept):
        k = rollouts[i]["actions"]
        logp[row, :k] = torch.tensor(rollouts[i]["new"], dtype=torch.float64)
        old[row, :k] = torch.tensor(rollouts[i]["old"], dtype=torch.float64)
        mu[row, :k] = torch.tensor(rollouts[i]["mu"], dtype=torch.float64)
        mask[row, :k] = 1.0
    traj = torch.arange(len(kept))
    # the local trainer's old log-probs are the sampler's, except a stale row's: π_old
    stale = torch.tensor([rollouts[i]["stale"] for i in kept])
    token_loss, _ = policy_token_loss(cfg.loss, logp, torch.where(stale[:, None], old, mu), adv, mask, traj,
                                      clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
    if bool(stale.any()):
        w, _ = importance_weights(old, mu, cfg.is_bound)
        token_loss = token_loss * torch.where(stale[:, None], w, torch.ones_like(w))
    weights = row_weights(cfg.aggregation, mask.sum(-1), traj, steps)
    return {i: float(a) for i, a in zip(kept, adv)}, aggregate(token_loss, mask, weights)


def phases(case: tuple[Path, str | None], tmp: Path, capsys) -> list[Path]:
    """The compiled job's launch scripts (none for a profile the target refuses as two roles
    trained every step, E602: test_openrlhf_every_job.py holds those to docs/cluster.md)."""
    spec, profile = case
    job = tmp / "job"
    chosen = ["--profile", profile] if profile else []
    rc = main(["compile", str(spec), *chosen, "--target", "openrlhf", "-o", str(job)])
    err = capsys.readouterr().err
    if rc != 0 and "error[E602]" in err:
        return []
    if (job / "job.json").exists() and json.loads((job / "job.json").read_text()).get("kind") == "multi_policy":
        # a multi-policy job: its step loop's equality is test_openrlhf_multi_policy.py's
        return []
    if rc != 0 and spec.parent == TEST_SPECS:  # a test spec written to be refused (its own test holds the error)
        pytest.skip(f"{spec.name} is refused by the target: {err.strip().splitlines()[0]}")
    assert rc == 0, err
    return sorted(job.glob("launch.sh")) + sorted(job.glob("phase-*/launch.sh"))


@pytest.mark.parametrize("case", CASES, ids=[f"{s.stem}-{p or 'default'}" for s, p in CASES])
def test_one_step_equals_the_local_trainers(case, tmp_path, monkeypatch, job_module, capsys) -> None:
    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    load_policy_loss(register)
    checked = 0
    scripts = phases(case, tmp_path, capsys)
    for k, script in enumerate(scripts):
        job = script.parent
        data = json.loads((job / "job.json").read_text())
        exp = ir.Experiment.model_validate(data["experiment"])
        cfg = next(t.config for t in exp.training if t.role == data["trained_role"] and t.config)
        (call,) = [c for c in launch_argv(script, tmp_path) if c[0] == "ray"]
        flags = train_flags(call)
        if "cispo" in flags:
            cispo = job_module(job, "cispo")
            cispo.install()
            with cispo.parser_accepts_cispo():
                args = parse_train_ppo_ray(flags)
        else:
            args = parse_train_ppo_ray(flags)
        if args.algo.advantage.estimator == "gae":  # OpenRLHF's own advantages, with a critic
            continue
        n = args.rollout.n_samples_per_prompt
        rollouts = step_rollouts(max(n, 2) if n > 1 else 1, cfg.max_staleness > 0, seed=k)
        if n == 1:  # one rollout a prompt: every rollout its own group
            for g, r in enumerate(rollouts):
                r["group"] = g
        adv, loss = openrlhf_step(job, args, rollouts, register, job_module)
        want_adv, want_loss = local_step(cfg, rollouts)
        for i, values in enumerate(adv):
            if i in want_adv:
                assert values.numel() == rollouts[i]["actions"]
                assert values.double().tolist() == pytest.approx([want_adv[i]] * values.numel(), abs=1e-6), (script, i)
            else:  # left out locally: no loss token in the job
                assert values.numel() == 0
        assert float(loss) == pytest.approx(float(want_loss), abs=1e-6), script
        # the old behaviour, OpenRLHF's own advantages over the whole group, differs
        old, _ = openrlhf_step(job, args, rollouts, register, job_module, hooked=False) if n > 1 else (None, None)
        if old is not None:
            assert any(values.numel() and abs(float(values[0]) - want_adv[i]) > 1e-3
                       for i, values in enumerate(old) if i in want_adv), script
        checked += 1
    capsys.readouterr()
    spec, profile = case
    if spec.parent == ROOT / "specs" and scripts:
        assert checked, "every seed profile that trains has a step to compare"
