"""TRL 1.16 and OpenRLHF 0.11.2 loss/advantage code, loaded on CPU so tests can run it on
the same tensors as ours. Each loader returns None when the package is not installed.

OpenRLHF: `openrlhf/models/loss.py` imports only torch and `.utils.masked_mean`, but the
package's `models/__init__.py` and `models/utils.py` import DeepSpeed; so `loss.py` is
loaded by file path under a stand-in package whose `utils` holds the real `masked_mean`
and `compute_reward` (their source, taken out of utils.py with `ast`). The advantage code
lives in `RemoteExperienceMaker.compute_advantages_and_returns`, in a module that imports
Ray; that one method is compiled alone, the same way, and run on a stub `self`."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _functions(path: Path, names: set[str], cls: str | None = None) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = tree.body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in found} == names, f"{path}: missing {names - {n.name for n in found}}"
    for n in found:
        n.decorator_list = []
    return "\n\n".join(ast.unparse(n) for n in found)


def openrlhf_root() -> Path | None:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def openrlhf_loss() -> Any:
    """OpenRLHF's `openrlhf/models/loss.py` as a module (PolicyLoss, SFTLoss, ...)."""
    root = openrlhf_root()
    if root is None:
        return None
    import torch
    from typing import Optional, Union

    pkg = types.ModuleType("_orlhf_models")
    pkg.__path__ = []  # a package, so that `from .utils import ...` resolves
    utils = types.ModuleType("_orlhf_models.utils")
    ns = utils.__dict__
    ns.update(torch=torch, Optional=Optional, Union=Union, Tuple=tuple)
    exec(_functions(root / "models" / "utils.py", {"masked_mean", "compute_reward"}), ns)
    sys.modules["_orlhf_models"] = pkg
    sys.modules["_orlhf_models.utils"] = utils
    spec = importlib.util.spec_from_file_location("_orlhf_models.loss", root / "models" / "loss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.compute_reward = ns["compute_reward"]
    return module


def openrlhf_advantages(estimator: str, rewards: list[float], n_samples: int, action_mask: Any) -> Any:
    """OpenRLHF's advantages for rewards laid out prompt-major (n_samples per prompt), one
    experience holding every sample; returns advantages [N, T] (constant along T)."""
    root = openrlhf_root()
    loss = openrlhf_loss()
    if root is None or loss is None:
        return None
    import torch

    logger = SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
    ns: dict[str, Any] = dict(torch=torch, itertools=itertools, List=list, Tuple=tuple,
                              compute_reward=loss.compute_reward, logger=logger)
    # the package's trainer/__init__ imports Ray and DeepSpeed: take the module's functions alone
    exec(_functions(root / "trainer" / "ppo_utils" / "length_penalty.py",
                    {"apply_length_penalties", "apply_overlong_penalty", "apply_stop_properly_penalty"}), ns)
    src = _functions(root / "trainer" / "ppo_utils" / "experience_maker.py",
                     {"compute_advantages_and_returns", "get_cumulative_returns"}, cls="RemoteExperienceMaker")
    exec(src, ns)
    n = len(rewards)
    args = SimpleNamespace(
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)),
        rollout=SimpleNamespace(n_samples_per_prompt=n_samples, max_new_tokens=None),
        reward=SimpleNamespace(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
        data=SimpleNamespace(max_len=None),
    )
    stub = SimpleNamespace(strategy=SimpleNamespace(args=args), kl_ctl=SimpleNamespace(value=0.0),
                           advantage_estimator=estimator)
    stub.get_cumulative_returns = types.MethodType(ns["get_cumulative_returns"], stub)
    mask = action_mask.float()
    exp = SimpleNamespace(index=list(range(n)), rewards=torch.tensor(rewards, dtype=torch.float32),
                          action_mask=mask, kl=torch.zeros_like(mask), info={}, values=None)
    out = ns["compute_advantages_and_returns"](stub, [exp])
    return out[0].advantages


def trl_compute_loss(loss_type: str, per_token_logps: Any, old_logps: Any, advantages: Any, mask: Any, *,
                     epsilon_low: float = 0.2, epsilon_high: float = 0.2, beta: float = 0.0, ref_logps: Any = None,
                     importance_sampling_level: str = "token", max_completion_length: int | None = None) -> Any:
    """TRL 1.16's `GRPOTrainer._compute_loss` run on a stub trainer whose model "returns"
    `per_token_logps`; returns TRL's loss (one accumulation step, one process)."""
    try:
        from trl.trainer.grpo_trainer import GRPOTrainer
    except ImportError:
        return None
    import collections

    import torch

    class _Accel:
        num_processes = 1
        sync_gradients = True

        def gather(self, x):
            return x

        gather_for_metrics = gather

        def reduce(self, x, reduction="sum"):
            return x

    stub = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=importance_sampling_level,
        beta=beta, loss_type=loss_type, epsilon_low=epsilon_low, epsilon_high=epsilon_high, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=max_completion_length,
        accelerator=_Accel(), _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
    )
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (per_token_logps, torch.zeros_like(per_token_logps), None)
    B, T = mask.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": advantages, "old_per_token_logps": old_logps,
        "num_items_in_batch": mask.sum(),
    }
    if ref_logps is not None:
        inputs["ref_per_token_logps"] = ref_logps
    return GRPOTrainer._compute_loss(stub, None, inputs)


def trl_nanstd() -> Any:
    try:
        from trl.trainer.utils import nanstd
    except ImportError:
        return None
    return nanstd
