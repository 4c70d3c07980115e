"""The CISPO extension a job ships (askspec_ext/): run through OpenRLHF 0.11.2's own
`PolicyLoss` on CPU it equals askspec's local CISPO (values and gradients), every other
loss type is OpenRLHF's unchanged, train_ppo_ray's parser accepts `cispo` only with the
extension, and the extension refuses an OpenRLHF it was not written for. With
`max_staleness` (asynchronous rollouts) its truncated importance weight equals the local
trainer's correction of a stale rollout."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from askspec.cli import main
from askspec.runtime.train.losses import aggregate, importance_weights, policy_token_loss, row_weights

from openrlhf_harness import launch_argv, parse_train_ppo_ray, stub_openrlhf_models, train_flags

SPEC = Path(__file__).parent / "specs" / "cispo.ask"


@pytest.fixture
def job(tmp_path, job_extension):
    """A compiled CISPO job: (its folder, the cispo module it ships, OpenRLHF's loss module)."""
    out = tmp_path / "job"
    assert main(["compile", str(SPEC), "--target", "openrlhf", "-o", str(out)]) == 0
    return (out, *job_extension(out))


@pytest.fixture
def async_job(tmp_path, job_extension):
    """The CISPO job with `max_staleness = 1; is_bound = 2.0`: (cispo module, loss module,
    train_ppo_ray's args parsed from its launch line)."""
    spec = tmp_path / "async.ask"
    spec.write_text(SPEC.read_text().replace("group = 4;", "group = 4; max_staleness = 1; is_bound = 2.0;"))
    out = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(out)]) == 0
    cispo, loss = job_extension(out)
    (call,) = launch_argv(out / "launch.sh", tmp_path)
    with cispo.parser_accepts_cispo():
        args = parse_train_ppo_ray(train_flags(call))
    return cispo, loss, args


def _actor_policy_loss(loss: ModuleType, args) -> object:
    """PolicyLoss(...) as OpenRLHF 0.11.2's PPO actor builds it from the parsed args
    (trainer/ray/ppo_actor.py)."""
    return loss.PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )


def _batch(seed: int, rows: int = 5, steps: int = 7, empty_row: bool = True):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, steps, 11, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 11, (rows, steps), generator=gen)
    # old log-probs up to e^±2.5 away: tokens clipped on both sides
    old = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1) + 2.5 * (
        2 * torch.rand(rows, steps, generator=gen, dtype=torch.float64) - 1)
    mask = (torch.rand(rows, steps, generator=gen) < 0.7).double()
    mask[:, 0] = 1
    if empty_row:  # a rollout with no trained token (action_ranges = [])
        mask[0] = 0
    adv = torch.randn(rows, generator=gen, dtype=torch.float64)
    return logits, tokens, old, mask, adv


def _logp(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    theta = logits.clone().requires_grad_(True)
    return theta, theta.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode,aggregation", [("token-mean", "token"), ("seq-mean-token-mean", "sequence")])
@pytest.mark.parametrize("clip", [(0.75, 3.0), (1.0, 2.0), (0.2, 0.28)])
def test_policy_loss_cispo_equals_local_cispo(job, seed, mode, aggregation, clip) -> None:
    _, cispo, loss = job
    cispo.install()
    # OpenRLHF's seq-mean-token-mean leaves a sequence with no trained token out of the mean,
    # where askspec's `sequence` counts every trajectory of the batch: they agree when each
    # trajectory has a trained token (askspec's trainer builds rows from trained turns only)
    logits, tokens, old, mask, adv = _batch(seed, empty_row=aggregation == "token")
    low, high = clip
    # OpenRLHF's call path: PolicyLoss built as its PPO actor builds it, called as it calls it
    fn = loss.PolicyLoss(clip_eps_low=low, clip_eps_high=high, dual_clip=None, token_level_loss=mode == "token-mean",
                         policy_loss_type="cispo")
    theta_o, logp_o = _logp(logits, tokens)
    got, clip_ratio, ppo_kl, vllm_kl, is_filter = fn(logp_o, old, adv[:, None].expand_as(logp_o), action_mask=mask,
                                                     rollout_log_probs=None)
    got.backward()
    # askspec's local trainer: one row per trajectory
    theta_l, logp_l = _logp(logits, tokens)
    traj = torch.arange(logits.shape[0])
    token_loss, clipped = policy_token_loss("cispo", logp_l, old, adv, mask, traj, clip_low=low, clip_high=high)
    want = aggregate(token_loss, mask, row_weights(aggregation, mask.sum(-1), traj))
    want.backward()
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (float(got.detach()), float(want.detach()))
    assert theta_o.grad is not None and theta_l.grad is not None
    assert torch.allclose(theta_o.grad, theta_l.grad, atol=1e-6, rtol=0)
    assert torch.count_nonzero(theta_o.grad * (1 - mask)[..., None]) == 0  # untrained tokens: no gradient
    assert float(clip_ratio) == pytest.approx(float((clipped.double() * mask).sum() / mask.sum()))
    assert 0 < float(clip_ratio) < 1 and vllm_kl is None and is_filter is None
    assert float(ppo_kl) == pytest.approx(float(((old - logp_l.detach()) * mask).sum() / mask.sum()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stale_rollouts_weighted_as_the_local_trainer_weights_them(async_job, seed) -> None:
    """The launch line's TIS flags (`max_staleness = 1; is_bound = 2.0`) build the loss as
    OpenRLHF's actor builds it; called with the sampler's log-probs μ beside π_old, its loss
    and gradients equal askspec's local update of stale rows (ratio against π_old, loss
    times min(π_old / μ, is_bound)), with rows whose μ equals π_old on-policy (w = 1)."""
    cispo, loss, args = async_job
    assert (args.train.async_enable, args.train.async_queue_size) == (True, 1)
    cispo.install()
    fn = _actor_policy_loss(loss, args)
    logits, tokens, old, mask, adv = _batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    # μ up to e^±1.5 from π_old on the stale rows (some weights truncated at 2.0); rows 1
    # and 3 sampled by the trained weights themselves
    rollout = old + 1.5 * (2 * torch.rand(old.shape, generator=gen, dtype=torch.float64) - 1)
    stale = [0, 2, 4]
    rollout[[1, 3]] = old[[1, 3]]
    theta_o, logp_o = _logp(logits, tokens)
    got, _, _, vllm_kl, is_filter = fn(logp_o, old, adv[:, None].expand_as(logp_o), action_mask=mask,
                                       rollout_log_probs=rollout)
    got.backward()
    # askspec's local update (runtime/train/policy.py): the stale rows' ratio against π_old,
    # their token loss times the truncated weight; the others as without staleness
    theta_l, logp_l = _logp(logits, tokens)
    traj = torch.arange(logits.shape[0])
    sel = torch.tensor(stale)
    w_rows, ratio = importance_weights(old[sel], rollout[sel], 2.0)
    w = torch.ones_like(old).index_copy(0, sel, w_rows)
    token_loss, _ = policy_token_loss("cispo", logp_l, old, adv, mask, traj, clip_low=0.75, clip_high=3.0)
    want = aggregate(token_loss * w, mask, row_weights("token", mask.sum(-1), traj))
    want.backward()
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (float(got.detach()), float(want.detach()))
    assert theta_o.grad is not None and theta_l.grad is not None
    assert torch.allclose(theta_o.grad, theta_l.grad, atol=1e-6, rtol=0)
    # the weight mattered: without it the loss differs
    unweighted = aggregate(token_loss, mask, row_weights("token", mask.sum(-1), traj))
    assert abs(float(unweighted.detach()) - float(want.detach())) > 1e-3
    # OpenRLHF's is_filter_ratio is the local is_truncated_share (tokens over is_bound)
    truncated = float(((ratio > 2.0).double() * mask[sel]).sum())
    assert 0 < truncated and float(is_filter) == pytest.approx(truncated / float(mask.sum()))
    assert float(vllm_kl) == pytest.approx(float(((rollout - old) * mask).sum() / mask.sum()))


def test_equal_log_probs_weigh_one(async_job) -> None:
    """A rollout whose sampler log-probs equal π_old's (on-policy, no staleness) gets weight
    1: the loss and gradients are the uncorrected loss's, bit for bit, and nothing is
    truncated."""
    cispo, loss, args = async_job
    cispo.install()
    logits, tokens, old, mask, adv = _batch(7)
    results = []
    for level, rollout in (("token", old.clone()), ("off", None)):
        args.algo.advantage.is_correction_level = level
        theta, logp = _logp(logits, tokens)
        out = _actor_policy_loss(loss, args)(logp, old, adv[:, None].expand_as(logp), action_mask=mask,
                                             rollout_log_probs=rollout)
        out[0].backward()
        results.append((out, theta.grad))
    (corrected, grad_c), (plain, grad_p) = results
    assert torch.equal(corrected[0], plain[0]) and torch.equal(grad_c, grad_p)
    assert float(corrected[4]) == 0.0 and float(corrected[3]) == 0.0 and plain[3] is None


def test_the_correction_needs_the_samplers_log_probs(async_job) -> None:
    cispo, loss, args = async_job
    cispo.install()
    logits, tokens, old, mask, adv = _batch(3)
    logp = _logp(logits, tokens)[1]
    with pytest.raises(ValueError, match="rollout_log_probs"):
        _actor_policy_loss(loss, args)(logp, old, adv[:, None].expand_as(logp), action_mask=mask)


def test_other_loss_types_stay_openrlhfs(job, monkeypatch) -> None:
    """`ppo` and `gspo` go to OpenRLHF's own forward, unchanged, once the extension is in."""
    _, cispo, loss = job
    logits, tokens, old, mask, adv = _batch(5)
    before = {}
    for kind in ("ppo", "gspo"):
        fn = loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type=kind)
        before[kind] = fn(_logp(logits, tokens)[1], old, adv[:, None].expand(-1, old.shape[1]), action_mask=mask)
    cispo.install()
    cispo.install()  # idempotent
    cispo.check_version()  # the fingerprint is of OpenRLHF's code, not of the installed wrappers
    for kind in ("ppo", "gspo"):
        fn = loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type=kind)
        after = fn(_logp(logits, tokens)[1], old, adv[:, None].expand(-1, old.shape[1]), action_mask=mask)
        for a, b in zip(before[kind], after):
            assert (a is None and b is None) or torch.equal(a, b), kind


def test_without_the_extension_openrlhf_has_no_cispo(job) -> None:
    _, _, loss = job
    logits, tokens, old, mask, adv = _batch(0)
    fn = loss.PolicyLoss(policy_loss_type="cispo")
    with pytest.raises(ValueError, match="Invalid policy loss type: cispo"):
        fn(_logp(logits, tokens)[1], old, adv[:, None].expand(-1, old.shape[1]), action_mask=mask)


def test_cispo_refuses_settings_it_does_not_implement(job) -> None:
    _, cispo, loss = job
    cispo.install()
    with pytest.raises(ValueError, match="dual_clip"):
        loss.PolicyLoss(policy_loss_type="cispo", dual_clip=3.0)
    # the token-level TIS is the one correction it implements (what max_staleness compiles to)
    for other in ({"is_correction_level": "seq"}, {"is_correction_level": "token", "is_correction_mode": "mask"},
                  {"is_correction_level": "token", "is_correction_gating": "tv", "is_correction_threshold": [0.0, 0.5]}):
        with pytest.raises(ValueError, match="token-level TIS only"):
            loss.PolicyLoss(policy_loss_type="cispo", **other)
    loss.PolicyLoss(policy_loss_type="cispo", is_correction_level="token", is_correction_mode="clip",
                    is_correction_threshold=[0.0, 2.0])


def test_launch_line_parses_only_with_the_extension(job, tmp_path) -> None:
    out, cispo, _ = job
    (call,) = launch_argv(out / "launch.sh", tmp_path)
    assert call[call.index("--") + 1:call.index("--") + 4] == ["python3", "-m", "askspec_ext.train_ppo_ray"]
    env = next(a for a in call if a.startswith("--runtime-env-json="))
    assert "worker_process_setup_hook" not in env  # the entry point gives it to OpenRLHF's ray.init
    with pytest.raises(SystemExit):  # OpenRLHF's own parser: invalid choice 'cispo'
        parse_train_ppo_ray(train_flags(call))
    with cispo.parser_accepts_cispo():
        args = parse_train_ppo_ray(train_flags(call))
    assert args.actor.policy_loss_type == "cispo" and tuple(args.actor.eps_clip_low_high) == (0.75, 3.0)
    assert args.algo.advantage.estimator == "group_norm"
    with pytest.raises(SystemExit):  # the parser is OpenRLHF's again once the block ends
        parse_train_ppo_ray(train_flags(call))


def test_refuses_another_openrlhf_version(job, monkeypatch) -> None:
    _, cispo, loss = job
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.12.0" if name == "openrlhf" else real(name))
    for attempt in (cispo.install, cispo.parser_accepts_cispo().__enter__):
        with pytest.raises(cispo.VersionMismatch, match=r"written for OpenRLHF 0\.11\.2.*openrlhf 0\.12\.0 is installed"):
            attempt()
    assert getattr(loss.PolicyLoss, "_askspec_wrapped", None) is None  # nothing was hooked


@pytest.mark.parametrize("version", ["0.12.0", "0.11.2"])
def test_a_renamed_policy_loss_is_refused_with_both_versions(job, monkeypatch, version) -> None:
    """An OpenRLHF whose PolicyLoss is renamed: the version is checked before the class is
    looked up, so the refusal names both versions (or, under 0.11.2, the changed code) and
    the remedy instead of an AttributeError."""
    _, cispo, loss = job
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version if name == "openrlhf" else real(name))
    monkeypatch.delattr(loss, "PolicyLoss")
    monkeypatch.setattr(loss, "PolicyLossV2", type("PolicyLossV2", (), {}), raising=False)
    why = r"openrlhf 0\.12\.0 is installed" if version == "0.12.0" else r"differs from the released 0\.11\.2's"
    for attempt in (cispo.install, cispo.parser_accepts_cispo().__enter__, cispo.check_version):
        with pytest.raises(cispo.VersionMismatch, match=rf"written for OpenRLHF 0\.11\.2 .*PolicyLoss.*{why}.*"
                                                         r"--substitute cispo=grpo"):
            attempt()


def test_refuses_changed_hooked_code_under_the_same_version(job, monkeypatch) -> None:
    """A patched or re-released 0.11.2 whose PolicyLoss.forward differs: the fingerprint."""
    _, cispo, loss = job

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, dp_size=1,
                batch_num_tokens=None, global_batch_size=None):
        raise AssertionError("a changed OpenRLHF")

    monkeypatch.setattr(loss.PolicyLoss, "forward", forward)
    with pytest.raises(cispo.VersionMismatch, match=r"differs from the released 0\.11\.2's.*--substitute cispo=grpo"):
        cispo.install()
    assert loss.PolicyLoss.forward is forward


def test_entry_point_installs_the_loss_then_runs_openrlhfs_main_with_the_hook(job, monkeypatch) -> None:
    """`python3 -m askspec_ext.train_ppo_ray`: the loss is in before OpenRLHF's module runs
    as __main__; inside it the parser accepts cispo and OpenRLHF's `ray.init(runtime_env=...)`
    gets the worker setup hook beside its own env_vars; afterwards both are OpenRLHF's again.
    (train_ppo_ray itself imports Ray, vLLM and DeepSpeed: a stand-in module plays it, running
    OpenRLHF's own parser and the ray.init call its train() makes.)"""
    out, cispo, loss = job
    entry = importlib.import_module("askspec_ext.train_ppo_ray")
    (call,) = launch_argv(out / "launch.sh", out.parent)
    inits: list[dict] = []
    ray = ModuleType("ray")
    ray.init = lambda *a, **kw: inits.append(kw)  # type: ignore[attr-defined]
    ray.is_initialized = lambda: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    seen = {}

    def run_module(name, run_name, alter_sys):
        assert (name, run_name) == ("openrlhf.cli.train_ppo_ray", "__main__")
        seen["installed"] = getattr(loss.PolicyLoss, "_askspec_wrapped", None) is not None
        seen["args"] = parse_train_ppo_ray(train_flags(call))
        import ray as ray_module  # as train() does: `import ray` at module top, then ray.init(...)

        ray_module.init(runtime_env={"env_vars": {"NCCL_DEBUG": "WARN"}})

    monkeypatch.setattr(entry.runpy, "run_module", run_module)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # (the finders go with the test)
    entry.main()
    assert seen["installed"] and seen["args"].actor.policy_loss_type == "cispo"
    # the driver gives the policy actors askspec's learning-rate schedule once it imports the launcher
    assert [f.module for f in sys.meta_path if type(f).__name__ == "_InstallAfterLoad"] == \
        ["openrlhf.trainer.ray.launcher"]
    assert inits == [{"runtime_env": {"env_vars": {"NCCL_DEBUG": "WARN"},
                                      "worker_process_setup_hook": "askspec_ext.train_ppo_ray.install_when_loaded"}}]
    with pytest.raises(SystemExit):
        parse_train_ppo_ray(train_flags(call))
    ray.init(runtime_env={})
    assert inits[-1] == {"runtime_env": {}}  # ray.init is Ray's again

def test_worker_hook_installs_the_loss_when_a_worker_imports_it(tmp_path, monkeypatch) -> None:
    """Ray runs `askspec_ext.cispo.install_when_loaded` in every worker before actor code:
    it imports nothing of OpenRLHF (a vLLM engine stays free of DeepSpeed), and the loss is
    hooked as soon as the worker imports openrlhf.models.loss, as the PPO actor does."""
    out = tmp_path / "job"
    assert main(["compile", str(SPEC), "--target", "openrlhf", "-o", str(out)]) == 0
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder goes with the test
    stub_openrlhf_models(lambda name, module: monkeypatch.setitem(sys.modules, name, module))
    monkeypatch.delitem(sys.modules, "openrlhf.models.loss", raising=False)
    monkeypatch.syspath_prepend(str(out))
    for name in [n for n in sys.modules if n.split(".")[0] == "askspec_ext"]:
        monkeypatch.delitem(sys.modules, name)
    hook = "askspec_ext.cispo.install_when_loaded"
    module, _, attr = hook.rpartition(".")
    getattr(importlib.import_module(module), attr)()  # as Ray's load_class + call
    getattr(importlib.import_module(module), attr)()  # twice: still one finder
    assert "openrlhf.models.loss" not in sys.modules
    try:
        loss = importlib.import_module("openrlhf.models.loss")
        assert getattr(loss.PolicyLoss, "_askspec_wrapped", None) is not None
        assert sys.modules["openrlhf.models.loss"] is loss
        assert not [f for f in sys.meta_path if type(f).__name__ == "_InstallAfterLoad"]  # it left
        logits, tokens, old, mask, adv = _batch(4)
        fn = loss.PolicyLoss(clip_eps_low=1.0, clip_eps_high=2.0, policy_loss_type="cispo")
        got = fn(_logp(logits, tokens)[1], old, adv[:, None].expand(-1, old.shape[1]), action_mask=mask)[0]
        assert torch.isfinite(got)
    finally:
        sys.modules.pop("openrlhf.models.loss", None)  # imported here, over the stand-in package
        for name in [n for n in sys.modules if n.split(".")[0] == "askspec_ext"]:
            del sys.modules[name]
