"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from askspec.runtime.train.advantages import advantages, zero_variance_groups

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
G = torch.tensor([0, 0, 0, 0, 1, 1])


def test_grpo_hand_values():
    # group 0: mean 0.5, Bessel std sqrt(1/3); group 1: all equal -> 0
    std = math.sqrt(((0.5**2) * 4) / 3)
    got = advantages("grpo", R, G)
    want = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.5 / (std + 1e-4), 0.0, 0.0]
    assert got.tolist() == pytest.approx(want, abs=1e-6)


def test_dr_grpo_and_group_norm():
    assert advantages("dr_grpo", R, G).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0])
    std = math.sqrt(1 / 3)
    assert advantages("group_norm", R, G).tolist() == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0, 0], abs=1e-6)


def test_rloo_hand_values_and_zero_sum_per_group():
    r = torch.tensor([1.0, 0.0, 3.0, 5.0, -1.0])
    g = torch.tensor([0, 0, 0, 1, 1])
    got = advantages("rloo", r, g)
    # 1 - mean(0, 3) = -0.5; 0 - mean(1, 3) = -2; 3 - mean(1, 0) = 2.5; 5 - (-1) = 6; -1 - 5 = -6
    assert got.tolist() == pytest.approx([-0.5, -2.0, 2.5, 6.0, -6.0])
    for k in (0, 1):
        assert float(got[g == k].sum()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_rloo_sums_to_zero_for_random_groups(seed):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randint(0, 4, (40,), generator=gen)
    g = torch.unique(g, return_inverse=True)[1]
    r = torch.randn(40, generator=gen)
    a = advantages("rloo", r, g)
    for k in torch.unique(g):
        if int((g == k).sum()) > 1:
            assert float(a[g == k].sum()) == pytest.approx(0.0, abs=1e-5)


def test_reinforce_family_is_whitened():
    r = torch.tensor([1.0, 3.0])
    g = torch.tensor([0, 1])
    got = advantages("reinforce", r, g)  # no baseline: (r - 2) / 1
    assert got.tolist() == pytest.approx([-1.0, 1.0], abs=1e-4)
    got = advantages("reinforce_baseline", torch.tensor([1.0, 3.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    # r - group mean = [-1, 1, 0, 0]; whitened: mean 0, var 0.5
    assert got.tolist() == pytest.approx([-1 / math.sqrt(0.5), 1 / math.sqrt(0.5), 0, 0], abs=1e-5)


def test_a_trajectory_alone_in_its_group_has_no_advantage():
    for est in ("grpo", "dr_grpo", "group_norm", "rloo"):
        assert advantages(est, torch.tensor([3.0]), torch.tensor([0])).tolist() == [0.0]


def test_zero_variance_groups_are_counted():
    assert zero_variance_groups(R, G) == 1
    assert zero_variance_groups(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([0, 0, 1])) == 1  # a lone one is not counted


# Reasoning Arena's group of N = 8 (App. B): Eq. 2 divides by the population σ
R8 = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
G8 = torch.zeros(8, dtype=torch.long)


@pytest.mark.parametrize("estimator, eps", [("grpo", 1e-4), ("group_norm", 1e-9)])
def test_std_sample_and_population_hand_values(estimator, eps):
    mean = 3 / 8
    sq = 3 * (1 - mean) ** 2 + 5 * mean**2
    sample, population = math.sqrt(sq / 7), math.sqrt(sq / 8)
    want = lambda sd: [(r - mean) / (sd + eps) for r in R8.tolist()]  # noqa: E731
    assert advantages(estimator, R8, G8).tolist() == pytest.approx(want(sample), abs=1e-6)  # the default
    assert advantages(estimator, R8, G8, std="sample").tolist() == pytest.approx(want(sample), abs=1e-6)
    assert advantages(estimator, R8, G8, std="population").tolist() == pytest.approx(want(population), abs=1e-6)
    # the sample std is √(8/7) times the population one: sample advantages are ×0.935 at N = 8
    ratio = advantages(estimator, R8, G8)[0] / advantages(estimator, R8, G8, std="population")[0]
    assert float(ratio) == pytest.approx(math.sqrt(7 / 8), abs=1e-3)


def test_std_leaves_estimators_without_a_std_division_and_lone_trajectories_alone():
    for est in ("dr_grpo", "rloo", "reinforce", "reinforce_baseline"):
        assert advantages(est, R, G, std="population").tolist() == advantages(est, R, G).tolist()
    assert advantages("grpo", torch.tensor([3.0]), torch.tensor([0]), std="population").tolist() == [0.0]
    with pytest.raises(ValueError, match="unknown advantage std 'bessel'"):
        advantages("grpo", R, G, std="bessel")


def test_std_is_lowered_into_the_trainers_config():
    from askspec.lang.compiler import compile_source
    from askspec.runtime.train.config import config_from_ir

    head = ('model m = hf("smollm2-135m-instruct")\nrole r { model = m; trained; prompt = "Answer." }\n'
            'game g sample 8 {\n    x = ask r\n    reward r = 1\n}\n')
    for body, want in (("train r with cispo { }", "sample"), ("train r with cispo { std = population }", "population"),
                       ("train r with group_norm { std = sample }", "sample")):
        res = compile_source("t.ask", head + body)
        assert res.ir is not None, [d.message for d in res.sink.sorted()]
        t = res.ir.training[0]
        assert config_from_ir(t, res.ir).std == want, body


# ---------------------------------------------------------------------------------------
# one reference (askspec.ir.advantages): the trainer's tensors, the TUI's groups, the
# trainer's train_steps.reward_std and the OpenRLHF hook's √(n / (n − 1)) all follow it


def random_groups(seed: int) -> list[list[float]]:
    """Groups of 1 to 9 rewards: 0/1 ones, dense ones and groups of equal rewards."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(int(torch.randint(1, 12, (1,), generator=gen))):
        n = int(torch.randint(1, 10, (1,), generator=gen))
        kind = g % 3
        if kind == 0:
            out.append([float(v) for v in torch.randint(0, 2, (n,), generator=gen)])
        elif kind == 1:
            out.append([round(float(v), 3) for v in torch.randn(n, generator=gen) * 3])
        else:
            out.append([0.25] * n)
    return out


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("std", ["sample", "population"])
def test_the_trainers_advantages_are_the_references_on_random_groups(seed, std):
    from askspec.ir.advantages import WHITENED, group_advantages
    from askspec.ir.vocab import ESTIMATORS

    from askspec.runtime.train.advantages import whiten

    groups = random_groups(seed)
    flat = torch.tensor([r for g in groups for r in g], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    for est in ESTIMATORS:
        want = torch.tensor([a for g in groups for a in group_advantages(est, g, std)], dtype=torch.float64)
        if est in WHITENED:  # over the whole batch, after the group's formula
            want = whiten(want, None)
        got = advantages(est, flat, ids, std=std)
        assert got.tolist() == pytest.approx(want.tolist(), rel=1e-5, abs=1e-5), (est, std, groups)


@pytest.mark.parametrize("seed", range(20))
def test_the_reference_std_is_the_sample_or_population_one(seed):
    from askspec.ir.advantages import group_advantages, group_std, population_over_sample

    for g in random_groups(seed):
        n = len(g)
        t = torch.tensor(g, dtype=torch.float64)
        assert group_std(g, "sample") == pytest.approx(float(t.std()) if n > 1 else 0.0, abs=1e-12)
        assert group_std(g, "population") == pytest.approx(float(t.std(unbiased=False)), abs=1e-12)
        # OpenRLHF's group_norm (sample std) times the hook's √(n / (n − 1)) is the population one
        sample = group_advantages("group_norm", g, "sample")
        population = group_advantages("group_norm", g, "population")
        if n > 1 and group_std(g) > 1e-6:
            assert [a * population_over_sample(n) for a in sample] == pytest.approx(population, rel=1e-6)


@pytest.mark.parametrize("std", ["sample", "population"])
def test_a_steps_reward_std_is_the_std_its_estimator_divides_by(std):
    from askspec.ir.advantages import group_std
    from askspec.runtime.train.batch import Trajectory
    from askspec.runtime.train.policy import batch_reward_stats

    rewards = [1.0, 0.0, 0.0, 0.5]
    batch = [Trajectory(f"s{i}/r", "g0", r, []) for i, r in enumerate(rewards)]
    got = batch_reward_stats(batch, std)["reward_std"]
    assert got == pytest.approx(group_std(rewards, std))
    assert got == pytest.approx(float(torch.tensor(rewards).std(unbiased=std == "sample")))
