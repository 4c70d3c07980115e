"""`std = population` on OpenRLHF: the job's askspec_ext/advantages.py, run through
OpenRLHF 0.11.2's own `RemoteExperienceMaker.compute_advantages_and_returns` on CPU with the
args its own parser makes of the generated launch line, gives askspec's local group_norm
advantages with the population std (runtime/train/advantages.py) on random grouped
rewards; `std = sample` ships no hook and OpenRLHF's own code already gives the local
sample-std advantages; other estimators are OpenRLHF's unchanged; the hook refuses an
OpenRLHF it was not written for."""

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


@pytest.mark.parametrize("n,seed", [(4, 0), (8, 1), (2, 2)])
def test_population_std_equals_local_advantages(tmp_path, openrlhf, ext, n, seed) -> None:
    module, exp_module = openrlhf
    job = compile_job(tmp_path, group=n)
    assert json.loads((job / "job.json").read_text())["extension"] == {"advantage_std": "population"}
    args = job_args(job, tmp_path)
    assert args.algo.advantage.estimator == "group_norm" and args.rollout.n_samples_per_prompt == n
    ext(job).install()
    experiences, rewards = batch(exp_module, n, groups=5, seed=seed)
    got = per_rollout(maker(module, args).compute_advantages_and_returns(experiences))
    groups = torch.arange(rewards.numel()) // n
    want = local_advantages("group_norm", rewards, groups, std="population")
    assert torch.allclose(torch.stack([got[i] for i in range(rewards.numel())]), want, atol=1e-6, rtol=0)
    sample = local_advantages("group_norm", rewards, groups, std="sample")
    assert not torch.allclose(want, sample, atol=1e-3)  # the two stds differ at this n
    assert all(torch.equal(e.returns, e.advantages) for e in experiences)


def test_sample_std_is_openrlhfs_own_code(tmp_path, openrlhf) -> None:
    """`std = sample` (the default): no extension, and OpenRLHF's group_norm is askspec's."""
    module, exp_module = openrlhf
    job = compile_job(tmp_path, block="std = sample")
    assert "extension" not in json.loads((job / "job.json").read_text()) and not (job / "askspec_ext").exists()
    experiences, rewards = batch(exp_module, 4, groups=5, seed=3)
    got = per_rollout(maker(module, job_args(job, tmp_path)).compute_advantages_and_returns(experiences))
    want = local_advantages("group_norm", rewards, torch.arange(rewards.numel()) // 4, std="sample")
    assert torch.allclose(torch.stack([got[i] for i in range(rewards.numel())]), want, atol=1e-6, rtol=0)


def test_other_estimators_stay_openrlhfs(tmp_path, openrlhf, ext) -> None:
    """std is read by group_norm only (the language refuses it beside rloo): the hook,
    installed, leaves an rloo job's advantages exactly as OpenRLHF's."""
    module, exp_module = openrlhf
    job = compile_job(tmp_path, algorithm="rloo", block="lr = 0.00001")
    args = job_args(job, tmp_path)
    before = per_rollout(maker(module, args).compute_advantages_and_returns(batch(exp_module, 4, 5, seed=4)[0]))
    population = tmp_path / "population"
    population.mkdir()
    ext(compile_job(population)).install()
    after = per_rollout(maker(module, args).compute_advantages_and_returns(batch(exp_module, 4, 5, seed=4)[0]))
    assert all(torch.equal(before[i], after[i]) for i in before)


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
