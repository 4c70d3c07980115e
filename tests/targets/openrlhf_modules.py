"""OpenRLHF 0.11.2's trainer modules (experience maker, PPO trainer, samples generator) on
CPU, for the tests of askspec_ext's hooks into them.

They import Ray, vLLM, DeepSpeed and peft at module top, which a CPU test machine lacks
or which would start nothing useful here, so `load_module` runs OpenRLHF's own source of a
module with its import statements replaced: each imported name is the one the test
provides, a light module imported for real (the standard library, torch, tqdm), or a
stand-in that fails loudly if the code under test reaches it. Everything the tests call
(`RemoteExperienceMaker.compute_advantages_and_returns`, `BasePPOTrainer.train_step` and
`ppo_train`, `SamplesGenerator._process_response_into_experience`,
`Experience`, `FixedKLController`) is OpenRLHF's code as installed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Optional, Union

import torch

from openrlhf_harness import OPENRLHF

LIGHT = {"itertools", "time", "datetime", "typing", "os", "abc", "heapq", "dataclasses", "torch", "tqdm", "numpy"}
Register = Callable[[str, ModuleType], None]


class Unavailable:
    """A stand-in for an import the code under test must not reach."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the test reached {self._what}.{name}, which is not loaded on CPU")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the test called {self._what}, which is not loaded on CPU")


def load_module(rel: str, name: str, register: Register, provided: dict[str, Any] | None = None) -> ModuleType:
    """OpenRLHF's `rel` (e.g. trainer/ppo_trainer.py) executed as module `name`, its
    imports bound as the module docstring says; registered through `register`."""
    provided = provided or {}
    tree = ast.parse((OPENRLHF / rel).read_text(encoding="utf-8"))
    module = ModuleType(name)
    module.__file__ = str(OPENRLHF / rel)
    body = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                module.__dict__[bound] = provided.get(bound) or _light(alias.name, None, rel)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name
                module.__dict__[bound] = provided.get(bound) or _light(node.module or "", alias.name, rel)
        else:
            body.append(node)
    register(name, module)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(OPENRLHF / rel), "exec"), module.__dict__)
    return module


def _light(module: str, attr: str | None, rel: str) -> Any:
    if module.split(".")[0] in LIGHT:
        m = importlib.import_module(module)
        return getattr(m, attr) if attr else m
    return Unavailable(f"{rel}: {module}{'.' + attr if attr else ''}")


def _file_module(rel: str, name: str, register: Register) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, OPENRLHF / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    register(name, module)
    spec.loader.exec_module(module)
    return module


def model_utils() -> dict[str, Any]:
    """OpenRLHF's own `compute_reward` and `masked_mean` (models/utils.py imports DeepSpeed)."""
    tree = ast.parse((OPENRLHF / "models/utils.py").read_text(encoding="utf-8"))
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("compute_reward", "masked_mean")]
    scope: dict[str, Any] = {"torch": torch, "Optional": Optional, "Union": Union, "Tuple": tuple}
    exec(compile(ast.Module(body=fns, type_ignores=[]), str(OPENRLHF / "models/utils.py"), "exec"), scope)
    return {n.name: scope[n.name] for n in fns}


def experience_module(register: Register) -> ModuleType:
    """trainer/ppo_utils/experience.py as it is (it imports only torch and OpenRLHF's utils)."""
    return _file_module("trainer/ppo_utils/experience.py", "openrlhf.trainer.ppo_utils.experience", register)


def experience_maker(register: Register) -> ModuleType:
    """trainer/ppo_utils/experience_maker.py as `openrlhf.trainer.ppo_utils.experience_maker`."""
    length = _file_module("trainer/ppo_utils/length_penalty.py", "openrlhf.trainer.ppo_utils.length_penalty", register)
    from openrlhf.utils.logging_utils import init_logger

    return load_module("trainer/ppo_utils/experience_maker.py", "openrlhf.trainer.ppo_utils.experience_maker",
                       register, {**model_utils(), "apply_length_penalties": length.apply_length_penalties,
                                  "Experience": experience_module(register).Experience, "init_logger": init_logger})


def ppo_trainer(register: Register) -> ModuleType:
    """trainer/ppo_trainer.py as `openrlhf.trainer.ppo_trainer`, with Ray as `ray_stand_in()`
    (a Ray actor group's method returns its results, not object refs)."""
    from openrlhf.utils.logging_utils import init_logger

    kl = _file_module("trainer/ppo_utils/kl_controller.py", "openrlhf.trainer.ppo_utils.kl_controller", register)
    return load_module("trainer/ppo_trainer.py", "openrlhf.trainer.ppo_trainer", register,
                       {"ray": ray_stand_in(), "init_logger": init_logger,
                        "FixedKLController": kl.FixedKLController, "AdaptiveKLController": kl.AdaptiveKLController})


def samples_generator(register: Register) -> ModuleType:
    """trainer/ppo_utils/samples_generator.py (for `_process_response_into_experience`)."""
    from openrlhf.utils.logging_utils import init_logger

    return load_module("trainer/ppo_utils/samples_generator.py", "openrlhf.trainer.ppo_utils.samples_generator",
                       register, {"Experience": experience_module(register).Experience, "init_logger": init_logger})


def ray_stand_in() -> SimpleNamespace:
    """`ray.remote` leaves the class as it is; `ray.get` returns what it is given."""
    return SimpleNamespace(remote=lambda cls: cls, get=lambda refs: refs)
