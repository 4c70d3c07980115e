"""`python3 -m askspec_ext.train_ppo_ray ARGS`: OpenRLHF 0.11.2's own
`python3 -m openrlhf.cli.train_ppo_ray ARGS` (its parser, validation and trainer, run as
`__main__`), with the CISPO loss installed first and `cispo` among the choices of
`--actor.policy_loss_type`. The Ray workers that build the loss install it through the
job's `worker_process_setup_hook` (launch.sh)."""

from __future__ import annotations

import runpy

from . import cispo


def main() -> None:
    cispo.install()  # fails here, before Ray starts, on an OpenRLHF it was not written for
    with cispo.parser_accepts_cispo():
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
