"""askspec's advantages on OpenRLHF: the job's askspec_ext/advantages.py, run through
OpenRLHF 0.11.2's own `RemoteExperienceMaker.compute_advantages_and_returns` on CPU with the
args its own parser makes of the generated launch line, gives the local trainer's
advantages (runtime/train/advantages.py: the block's estimator, its std and ε) on random
grouped rewards, for `std = population` (Reasoning Arena's Eq. 2), `std = sample` and every
other estimator but gae, which stays OpenRLHF's; a rollout the agent trained no turn of, or
with no loss token, is left out of its group; the hook refuses an OpenRLHF it was not
written for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from askspec.cli import main
from askspec.runtime.train.advantages import advantages as local_advantages

from openrlhf_harness import assert_pin_refusals, launch_argv, parse_train_ppo_ray, train_flags
from openrlhf_modules import experience_maker, experience_module

SPEC = """
model m = hf("smollm2-135m-instruct") {{ max_tokens = 32 }}
role s {{ model = m; trained }}
game practice for x in range(0, 8) {{
    a = ask s using "Solve {{{{ x }}}}."
    reward s = 1.0
}}
train s with {algorithm} {{ group = {group}; batch = {batch}; {block} }}
"""


def compile_job(tmp: Path, algorithm: str = "grpo", group: int = 4, block: str = "std = population") -> Path:
    (tmp / "w.ask").write_text(SPEC.format(algorithm=algorithm, group=group, batch=2 * group, block=block))
    out = tmp / "job"
    assert main(["compile", str(tmp / "w.ask"), "--target", "openrlhf", "-o", str(out)]) == 0
    return out


@pytest.fixture
def openrlhf(monkeypatch):
    """(OpenRLHF's experience_maker module, its experience module), loaded on CPU."""
    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    return experience_maker(register), experience_module(register)


@pytest.fixture
def ext(job_module):
    """`load(job)`: the job's askspec_ext.advantages, imported from its folder."""
    return lambda job: job_module(job, "advantages")


def job_args(job: Path, tmp: Path):
    """train_ppo_ray's args, by its own parser, from the job's launch line."""
    (call,) = launch_argv(job / "launch.sh", tmp)
    return parse_train_ppo_ray(train_flags(call))


def batch(exp_module, n: int, groups: int, seed: int, micro: int = 3):
    """Rollouts of `groups` prompts × n samples with random rewards and action masks, in
    OpenRLHF's micro-batches (`index`: each rollout's place in prompt order, shuffled as its
    dynamic batching may leave them). Returns (experiences, rewards in prompt order)."""
    gen = torch.Generator().manual_seed(seed)
    total = groups * n
    # multiples of 1/64: OpenRLHF's group statistics are float32 and askspec's float64, so
    # rewards a group holds within ~1e-3 of each other differ by up to ~1e-5 (either std);
    # on this grid every group mean is exact and the two agree to 1e-6
    rewards = torch.randint(0, 65, (total,), generator=gen).float() / 64
    rewards[:n] = 0.5  # a group whose rewards are all equal
    order = torch.randperm(total, generator=gen).tolist()
    out = []
    for start in range(0, total, micro):
        idx = order[start:start + micro]
        steps = 6
        mask = (torch.rand(len(idx), steps, generator=gen) < 0.7).long()
        mask[:, 0] = 1
        e = exp_module.Experience(sequences=torch.zeros(len(idx), steps + 1, dtype=torch.long), action_mask=mask,
                                  rewards=rewards[idx].clone(), kl=torch.zeros(len(idx), steps), info={})
        e.index = idx
        out.append(e)
    return out, rewards


def maker(module, args):
    """A RemoteExperienceMaker as OpenRLHF's trainer builds one, without its Ray actor groups
    (compute_advantages_and_returns reads only the strategy's args and the KL controller)."""
    m = object.__new__(module.RemoteExperienceMaker)
    m.strategy = type("Strategy", (), {"args": args})()
    m.args = args
    m.advantage_estimator = args.algo.advantage.estimator
    m.kl_ctl = type("KL", (), {"value": args.algo.kl.init_coef})()
    return m


def per_rollout(experiences) -> dict[int, torch.Tensor]:
    """Each rollout's advantage at its action tokens (one value: the trajectory's)."""
    out = {}
    for e in experiences:
        for row, i in enumerate(e.index):
            values = e.advantages[row][e.action_mask[row].bool()]
            assert torch.all(values == values[0]), values  # γ = 1, KL not in the reward: one value per rollout
            out[i] = values[0]
    return out


ONE_STEP = {"steps": 1, "warmup": 0, "decay": "constant", "floor": 0.0}  # these specs' schedule (one step)


def job_extension(job: Path) -> dict:
    """job.json's `extension`, its learning-rate schedule and prompt order checked (every RL
    job has both)."""
    ext = json.loads((job / "job.json").read_text()).get("extension") or {}
    assert ext.pop("lr_schedule") == ONE_STEP and ext.pop("prompt_order") == "sequential"
    return ext


def local(estimator: str, experiences, rewards: torch.Tensor, n: int, std: str) -> torch.Tensor:
    """The local trainer's advantages for every rollout of the batch (in prompt order)."""
    tokens = {i: float(e.action_mask[row].sum()) for e in experiences for row, i in enumerate(e.index)}
    counts = torch.tensor([tokens[i] for i in range(rewards.numel())], dtype=torch.float64)
    return local_advantages(estimator, rewards, torch.arange(rewards.numel()) // n, counts, std)


@pytest.mark.parametrize("n,seed", [(4, 0), (8, 1), (2, 2)])
def test_population_std_equals_local_advantages(tmp_path, openrlhf, ext, n, seed) -> None:
    module, exp_module = openrlhf
    job = compile_job(tmp_path, group=n)
    assert job_extension(job) == {"advantage_std": "population",
                                  "advantages": {"estimator": "grpo", "std": "population"}}
    args = job_args(job, tmp_path)
    assert args.algo.advantage.estimator == "group_norm" and args.rollout.n_samples_per_prompt == n
    ext(job).install()
    experiences, rewards = batch(exp_module, n, groups=5, seed=seed)
    got = per_rollout(maker(module, args).compute_advantages_and_returns(experiences))
    got = torch.stack([got[i] for i in range(rewards.numel())])
    want = local("grpo", experiences, rewards, n, "population")
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    sample = local("grpo", experiences, rewards, n, "sample")
    assert not torch.allclose(want, sample, atol=1e-3)  # the two stds differ at this n
    assert all(torch.equal(e.returns, e.advantages) for e in experiences)


def test_sample_std_equals_local_advantages(tmp_path, openrlhf, ext) -> None:
    """`std = sample` (the default): the hook too, with grpo's ε (1e-4), where OpenRLHF's own
    group_norm adds 1e-9."""
    module, exp_module = openrlhf
    job = compile_job(tmp_path, block="std = sample")
    assert job_extension(job) == {"advantages": {"estimator": "grpo", "std": "sample"}}
    assert (job / "askspec_ext").is_dir()
    args = job_args(job, tmp_path)
    own = per_rollout(maker(module, args).compute_advantages_and_returns(batch(exp_module, 4, 5, seed=3)[0]))
    ext(job).install()
    experiences, rewards = batch(exp_module, 4, groups=5, seed=3)
    got = per_rollout(maker(module, args).compute_advantages_and_returns(experiences))
    got = torch.stack([got[i] for i in range(rewards.numel())])
    assert torch.allclose(got, local("grpo", experiences, rewards, 4, "sample"), atol=1e-6, rtol=0)
    own = torch.stack([own[i] for i in range(rewards.numel())])  # OpenRLHF's: group_norm, ε 1e-9
    assert torch.allclose(own, local("group_norm", experiences, rewards, 4, "sample"), atol=1e-6, rtol=0)
    assert not torch.allclose(got, own, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["group_norm", "dr_grpo", "rloo", "reinforce_baseline", "reinforce"])
def test_every_estimator_but_gae_is_askspecs(tmp_path, openrlhf, ext, algorithm) -> None:
    """Each estimator's job ships the hook with its own estimator, and the hook gives the local
    trainer's advantages (the reinforce estimators whitened over the batch's tokens)."""
    module, exp_module = openrlhf
    # (dr_grpo's own `constant` aggregation has no OpenRLHF equivalent, E604: a token mean is chosen)
    block = "lr = 0.00001" + ("; aggregation = token" if algorithm == "dr_grpo" else "")
    job = compile_job(tmp_path, algorithm=algorithm, block=block)
    assert job_extension(job) == {"advantages": {"estimator": algorithm, "std": "sample"}}
    args = job_args(job, tmp_path)
    ext(job).install()
    experiences, rewards = batch(exp_module, 4, groups=5, seed=4)
    got = per_rollout(maker(module, args).compute_advantages_and_returns(experiences))
    got = torch.stack([got[i] for i in range(rewards.numel())])
    assert torch.allclose(got, local(algorithm, experiences, rewards, 4, "sample"), atol=1e-5, rtol=0)
    assert got.abs().sum() > 0


def test_gae_stays_openrlhfs(tmp_path, openrlhf, ext) -> None:
    """askspec's ppo is the local trainer's (grpo advantages, the PPO loss), never gae; and
    the hook, installed, leaves a gae job's advantages (`--algo.advantage.estimator gae`
    passed to launch.sh) exactly as OpenRLHF's."""
    module, exp_module = openrlhf
    job = compile_job(tmp_path, algorithm="ppo", block="lr = 0.00001")
    assert job_extension(job)["advantages"] == {"estimator": "grpo", "std": "sample"}
    args = job_args(job, tmp_path)
    assert (args.algo.advantage.estimator, args.actor.policy_loss_type) == ("group_norm", "ppo")
    args.algo.advantage.estimator = "gae"

    def with_values(seed):
        experiences = batch(exp_module, 4, 5, seed=seed)[0]
        gen = torch.Generator().manual_seed(seed)
        for e in experiences:
            e.values = torch.rand(e.action_mask.shape, generator=gen)
        return experiences

    before = maker(module, args).compute_advantages_and_returns(with_values(6))
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    ext(compile_job(grpo)).install()
    after = maker(module, args).compute_advantages_and_returns(with_values(6))
    assert all(torch.equal(b.advantages, a.advantages) and torch.equal(b.returns, a.returns)
               for b, a in zip(before, after))


def test_untrained_and_tokenless_members_are_left_out(tmp_path, openrlhf, ext) -> None:
    """A rollout the agent trained no turn of (`askspec_trained_turns` 0: unrewarded, dropped,
    failed) or with no loss token is left out of its group, as the local trainer's batch leaves
    it out, and gets advantage 0; its group's std (logged) is over the others."""
    module, exp_module = openrlhf
    job = compile_job(tmp_path)
    args = job_args(job, tmp_path)
    ext(job).install()
    experiences, rewards = batch(exp_module, 4, groups=3, seed=7)
    untrained, tokenless = 5, 9  # in groups 1 and 2
    for e in experiences:
        e.info["askspec_trained_turns"] = torch.tensor([0.0 if i == untrained else 1.0 for i in e.index])
        for row, i in enumerate(e.index):
            if i == tokenless:
                e.action_mask[row] = 0
    got = per_rollout_or_none(maker(module, args).compute_advantages_and_returns(experiences))
    kept = [i for i in range(rewards.numel()) if i not in (untrained, tokenless)]
    want = local_advantages("grpo", rewards[kept], torch.tensor([i // 4 for i in kept]), std="population")
    assert torch.allclose(torch.stack([got[i] for i in kept]), want, atol=1e-6, rtol=0)
    assert got[untrained] == 0 and got[tokenless] is None  # no action token carries one
    everyone = local_advantages("grpo", rewards, torch.arange(rewards.numel()) // 4, std="population")
    assert not torch.allclose(torch.stack([got[i] for i in kept]), everyone[kept], atol=1e-3)
    stds = {i: float(e.info["group_reward_std"][row]) for e in experiences for row, i in enumerate(e.index)}
    assert stds[4] == pytest.approx(float(rewards[[6, 7, 4]].std(unbiased=False)), abs=1e-6)


def per_rollout_or_none(experiences) -> dict[int, torch.Tensor | None]:
    out: dict[int, torch.Tensor | None] = {}
    for e in experiences:
        for row, i in enumerate(e.index):
            values = e.advantages[row][e.action_mask[row].bool()]
            assert values.numel() == 0 or torch.all(values == values[0]), values
            out[i] = values[0] if values.numel() else None
    return out


def test_kl_in_the_reward_is_refused(tmp_path, openrlhf, ext) -> None:
    module, exp_module = openrlhf
    job = compile_job(tmp_path)
    args = job_args(job, tmp_path)
    ext(job).install()
    args.algo.kl.init_coef, args.algo.kl.use_loss = 0.1, False
    with pytest.raises(ValueError, match="--algo.kl.use_loss"):
        maker(module, args).compute_advantages_and_returns(batch(exp_module, 4, 2, seed=5)[0])


def test_refuses_another_openrlhf(tmp_path, openrlhf, ext, monkeypatch) -> None:
    module, _ = openrlhf
    assert_pin_refusals(ext(compile_job(tmp_path)), "def compute_advantages_and_returns(self): ...", monkeypatch)
    assert getattr(module.RemoteExperienceMaker, "_askspec_population_std", None) is None  # nothing was hooked
