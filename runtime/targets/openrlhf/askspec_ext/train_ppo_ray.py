"""`python3 -m askspec_ext.train_ppo_ray ARGS`: OpenRLHF 0.11.2's own
`python3 -m openrlhf.cli.train_ppo_ray ARGS` (its parser, validation and trainer, run as
`__main__`), with the CISPO loss installed first and `cispo` among the choices of
`--actor.policy_loss_type`, and the hooks the job asks for (job.json's `extension`):
askspec's advantages (its estimator over its groups, `std` included: advantages.py), its
training step (gate.py: a step with no loss token skipped, the update gate of
`update_when`), the role's state carried from its previous phase (carry.py), its
learning-rate schedule laid out over the role's whole schedule (schedule.py) and its
prompts read in the order askspec wrote them, the local steps' (sequential.py), each
checked against the OpenRLHF it was written for before Ray starts.

The Ray workers build the loss, the experiences and the training steps, so they install
the hooks too: OpenRLHF's `train()` starts Ray with `ray.init(runtime_env={"env_vars":
...})`, and this entry point adds `"worker_process_setup_hook":
"askspec_ext.train_ppo_ray.install_when_loaded"` to that call, which Ray runs in every
worker process of the job before any actor code; it installs each hook in the workers
that import the module it hooks. (The hook is not in launch.sh's
job-level runtime environment: a hook given at job submission and processed again by the
driver's own `ray.init` trips an assertion in some Ray releases, ray-project/ray#61350.)"""

from __future__ import annotations

import contextlib
import runpy
from typing import Any, Iterator

from . import advantages, carry, cispo, gate, pinned, schedule, sequential

SETUP_HOOK = "askspec_ext.train_ppo_ray.install_when_loaded"


def uses_cispo(settings: dict[str, Any]) -> bool:
    """Whether the job trains with the CISPO loss (job.json's `extension.policy_loss`): a
    job whose extension is only the update gate or the population std must not be
    refused for a loss it does not use."""
    return settings.get("policy_loss") == cispo.NAME


def install_when_loaded() -> None:
    """The Ray workers' setup hook: every hook the job needs, each installed once the
    worker imports the module it hooks (a vLLM engine imports none of them)."""
    settings = pinned.job_settings()
    if uses_cispo(settings):
        cispo.install_when_loaded()
    if advantages.used(settings):
        advantages.install_when_loaded()
    if gate.used(settings):
        gate.install_when_loaded()
    if carry.used(settings):
        carry.install_when_loaded()
    if sequential.used(settings):
        sequential.install_when_loaded()


def with_setup_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """`runtime_env` (OpenRLHF's) with the worker setup hook that installs the loss."""
    env = dict(runtime_env or {})
    hook = env.get("worker_process_setup_hook")
    if hook not in (None, SETUP_HOOK):
        raise RuntimeError(f"OpenRLHF's ray.init already sets a worker_process_setup_hook ({hook!r}); askspec's "
                           f"extension needs its own ({SETUP_HOOK}) and was written for OpenRLHF {pinned.WRITTEN_FOR}")
    env["worker_process_setup_hook"] = SETUP_HOOK
    return env


@contextlib.contextmanager
def workers_install_cispo() -> Iterator[None]:
    """While open, `ray.init` starts Ray with the setup hook in its runtime environment."""
    import ray

    original = ray.init

    def init(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime_env"] = with_setup_hook(kwargs.get("runtime_env"))
        return original(*args, **kwargs)

    ray.init = init
    try:
        yield
    finally:
        ray.init = original


def main() -> None:
    # each hook the job uses is checked here, before Ray starts, against the OpenRLHF it was
    # written for; its refusal names that hook and the way out for this job
    settings = pinned.job_settings()
    cispo_used = uses_cispo(settings)
    if cispo_used:
        cispo.install()
    if advantages.used(settings):
        advantages.check_version()
    if gate.used(settings):
        gate.check_version()
    if carry.used(settings):
        carry.check_version()
    if sequential.used(settings):
        sequential.check_version()
    if schedule.used(settings):  # (in this process, the driver: it builds the actor groups)
        schedule.check_version()
        schedule.install_when_loaded()
    parser = cispo.parser_accepts_cispo() if cispo_used else contextlib.nullcontext()
    with parser, workers_install_cispo():
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
