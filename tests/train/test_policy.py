"""The update step and checkpoints of a trained role on a tiny random Llama (tests/conftest.py's
`tiny_model`): every algorithm runs, gradient accumulation gives the full batch's update,
the KL penalty is zero at the start, checkpoints round-trip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from askspec.ir import model as ir
from askspec.lang.training import lower_training
from askspec.runtime.train.batch import Trajectory, Turn
from askspec.runtime.train.config import config_from_ir

pytestmark = pytest.mark.slow  # builds a tiny model with SmolLM2's tokenizer (the converted GGUF)


def policy_for(folder: Path, algorithm: str = "grpo", args: dict | None = None, **hyper):
    from askspec.runtime.train.policy import TrainedPolicy

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm=algorithm)]),
                         {"r": {**(args or {}), "lr": 0.01, **hyper}})
    return TrainedPolicy(config_from_ir(exp.training[0], exp), str(folder), {"num_threads": 1})


def trajectories(n: int = 6, seed: int = 0) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        turns = []
        for k in range(1 + i % 2):  # some trajectories have two turns
            c = int(torch.randint(2, 6, (1,), generator=gen))
            ids = torch.randint(10, 1000, (c,), generator=gen).tolist()
            turns.append(Turn(f"s{i}", 1, k, torch.randint(10, 1000, (5,), generator=gen).tolist(), ids,
                              (-torch.rand(c, generator=gen) * 3 - 8).tolist(), 1.0, "stop"))
        out.append(Trajectory(f"s{i}/r", f"g{i // 3}", float(i % 3), turns))
    return out


@pytest.mark.parametrize("algorithm, args", [("grpo", {}), ("dr_grpo", {}), ("group_norm", {}), ("rloo", {}),
                                             ("reinforce", {}), ("reinforce_baseline", {}),
                                             ("ppo", {"estimator": "rloo", "dual_clip": 3.0}),
                                             ("gspo", {}), ("cispo", {"clip_low": 0.75, "clip_high": 3.0}),
                                             ("sft", {"min_reward": 1.0})])
def test_every_algorithm_updates_the_weights(tiny_model, algorithm, args):
    policy = policy_for(tiny_model, algorithm, args)
    before = [p.detach().clone() for p in policy.params]
    m = policy.update(trajectories())
    assert policy.version == 1 and m["loss"] is not None and m["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.params))
    if algorithm == "sft":
        assert m["trajectories"] == 4  # min_reward = 1 keeps rewards 1 and 2


def test_gradient_accumulation_gives_the_full_batch_update(tiny_model):
    grads = {}
    for name, micro in (("one", 1), ("all", 64)):
        policy = policy_for(tiny_model, "cispo", {"clip_high": 3.0}, micro_batch=micro)
        # the gradient the optimizer sees (Adam's first step is ≈ lr·sign(g): it would
        # amplify float rounding in near-zero entries)
        policy.optimizer.step = lambda *a, _p=policy, _n=name: grads.__setitem__(_n, [x.grad.clone() for x in _p.params])
        m = policy.update(trajectories())
        grads[name + "_loss"] = m["loss"]
    assert grads["one_loss"] == pytest.approx(grads["all_loss"], abs=1e-6)
    for g1, g2 in zip(grads["one"], grads["all"]):
        assert torch.allclose(g1, g2, atol=1e-7)


def test_kl_to_the_frozen_reference_starts_at_zero(tiny_model):
    # the step reports its last epoch's KL: zero in the first update's only epoch (the
    # policy is the reference), positive once an update has moved the weights
    policy = policy_for(tiny_model, "grpo", kl=0.1, kl_estimator="k3")
    assert policy.update(trajectories())["kl"] == pytest.approx(0.0, abs=1e-9)
    assert policy.ref is not None and all(not p.requires_grad for p in policy.ref.parameters())
    assert policy.update(trajectories(seed=1))["kl"] > 1e-9
    two_epochs = policy_for(tiny_model, "grpo", kl=0.1, kl_estimator="k3", epochs=2)
    assert two_epochs.update(trajectories())["kl"] > 1e-9  # epoch 2 moved away from the reference


def test_warmup_and_cosine_schedule(tiny_model):
    policy = policy_for(tiny_model, "grpo", warmup=2, decay="cosine", steps=6, min_lr=0.001)
    lrs = [policy.update(trajectories())["lr"] for _ in range(6)]
    assert lrs[0] == pytest.approx(0.005) and lrs[1] == pytest.approx(0.01)
    assert lrs[-1] == pytest.approx(0.001) and lrs[2] > lrs[3] > lrs[4] > lrs[5]


def test_checkpoint_round_trip_restores_weights_and_optimizer(tiny_model, tmp_path):
    from askspec.runtime.train.policy import TrainedPolicy

    policy = policy_for(tiny_model, "grpo")
    policy.update(trajectories())
    ckpt = tmp_path / "r" / "step-1"
    policy.save(ckpt, 1, {"loss": 0.5})
    assert (ckpt / "model.safetensors").exists() and (ckpt / "optimizer.safetensors").exists()
    again = TrainedPolicy(policy.cfg, str(tiny_model), {"num_threads": 1}, init_from=ckpt)
    again.load_optimizer(ckpt)
    assert again.version == 1
    for p, q in zip(policy.params, again.params):
        assert torch.equal(p, q)
    m1, m2 = policy.update(trajectories(seed=2)), again.update(trajectories(seed=2))
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-7)
    for p, q in zip(policy.params, again.params):
        assert torch.allclose(p, q, atol=1e-7)
    shutil.rmtree(ckpt)


def test_a_step_records_its_advantage_diagnostics(tiny_model):
    """Reasoning Arena Fig. 5: the step's mean |advantage| and share of zero advantages, from
    the advantages the update used (grpo: (r − mean) / (Bessel std + 1e-4) per group)."""
    policy = policy_for(tiny_model, "grpo")
    m = policy.update(trajectories())  # two groups of rewards 0, 1, 2: advantages ±1/(1 + 1e-4) and 0
    assert m["abs_adv_mean"] == pytest.approx((4 / (1 + 1e-4)) / 6)
    assert m["zero_adv_share"] == pytest.approx(2 / 6)


def test_a_shared_prompt_runs_through_the_model_once(tiny_model):
    """The rows of a group share their prompt: its tokens are fed once, and the log-probs and
    their gradients equal those of one whole pass per row (prompts of different lengths, one
    of a single token, completions of different lengths, a temperature)."""
    policy = policy_for(tiny_model)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 1000, (n,), generator=gen).tolist() for n in (7, 4, 1)]
    turns = []
    for k, p in enumerate((0, 0, 0, 1, 1, 2)):
        c = 2 + k % 3
        turns.append(Turn(f"s{k}", 1, 0, prompts[p], torch.randint(10, 1000, (c,), generator=gen).tolist(), [0.0] * c,
                          0.7 if k == 1 else 1.0, "stop"))
    fed: list[int] = []
    hook = policy.model.get_input_embeddings().register_forward_hook(lambda m, i, o: fed.append(i[0].numel()))
    logp, mask = policy.token_logprobs(policy.model, turns)
    hook.remove()
    # the 3 distinct prompts but their last token, padded to 6, then 6 rows of the last prompt
    # token and the completion but its last token, padded to 4 (6 whole rows: 6 x 11 = 66)
    assert sum(fed) == 3 * 6 + 6 * 4
    logp.sum().backward()
    shared = [p.grad.clone() for p in policy.params]
    policy.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for i, t in enumerate(turns):
        n, c = len(t.prompt_ids), len(t.completion_ids)
        logits = policy.model(input_ids=torch.tensor([t.prompt_ids + t.completion_ids])).logits[0, n - 1 : n - 1 + c]
        alone = (logits / t.temperature).log_softmax(-1).gather(-1, torch.tensor(t.completion_ids)[:, None])[:, 0]
        assert torch.allclose(logp[i, :c], alone, atol=1e-5), i
        assert bool(mask[i, :c].all()) and not bool(mask[i, c:].any()) and not bool(logp[i, c:].any())
        total = total + alone.sum()
    total.backward()
    for g, p in zip(shared, policy.params):
        assert torch.allclose(g, p.grad, atol=1e-5, rtol=1e-4)
