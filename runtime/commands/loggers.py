"""`askspec run --log tensorboard[:DIR]` and `--log wandb[:PROJECT]`: every `train_steps`
column of every trained role, per stage, as each step ends, with the run's identity (the
spec's name and hash, the `--set` values, the seed, the run id) as the logged run's
config. The packages are optional extras (`pip install 'askspec[tensorboard]'`,
`'askspec[wandb]'`); a missing one is a usage error before the run starts.

Tags are `ROLE/COLUMN`, or `ROLE/STAGE/COLUMN` for a step of a declared stage; the x axis
is the global training step. `skipped` is logged as 1 (the update did not run) or 0, its
reason as text. The spec's declared metrics over the step's sessions are logged as
`metrics/NAME` (`metrics/NAME/KEY=VALUE,...` per `by` group) when they have a number."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from askspec.runtime.commands.options import LogTarget
from askspec.runtime.store.layout import TRAIN_STEP_COLUMNS

# numbers the trainer records besides the flat columns (metrics JSON), logged alongside them;
# policy_version always, the last four only with max_staleness > 0 (asynchronous rollouts)
EXTRA_NUMBERS = ("seconds_play", "seconds_update", "generated_tokens", "trajectories", "groups", "abs_adv_mean",
                 "policy_version", "sampling_version", "is_ratio_mean", "is_truncated_share", "stale_share")


def step_values(metrics: dict[str, Any]) -> tuple[dict[str, float], str | None]:
    """The numbers one role's step logs (the train_steps columns, `skipped` as 0/1, and
    EXTRA_NUMBERS), and the skip reason (None when the update ran)."""
    out: dict[str, float] = {}
    for key in (*TRAIN_STEP_COLUMNS, *EXTRA_NUMBERS):
        if key == "skipped":
            out[key] = 1.0 if metrics.get("skipped") else 0.0
            continue
        v = metrics.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    reason = None
    if metrics.get("skipped"):
        reason = f"{metrics['skipped']}: {metrics.get('skip_reason') or ''}".rstrip(": ")
    return out, reason


def declared_values(rows: list[dict[str, Any]] | None) -> dict[str, float]:
    """The declared metrics of a step (engine/metrics.py's rows) that have a number, by tag:
    `metrics/NAME`, or `metrics/NAME/KEY=VALUE,...` for a `by` group."""
    out: dict[str, float] = {}
    for row in rows or ():
        v = row.get("value")
        if not isinstance(v, (int, float)) or row.get("n") == 0:
            continue
        by = ",".join(f"{k}={val}" for k, val in row["by"].items())
        out[f"metrics/{row['metric']}" + (f"/{by}" if by else "")] = float(v)
    return out


def _prefix(role: str, metrics: dict[str, Any]) -> str:
    stage = metrics.get("stage")
    return f"{role}/{stage}" if stage else role


class StepLogger(Protocol):
    def step(self, step: int, metrics: dict[str, dict[str, Any]],
             declared: list[dict[str, Any]] | None = None) -> None: ...
    def close(self) -> None: ...


class TensorBoardLogger:
    """Event files under DIR/RUN_ID (default: the run directory's `tensorboard/`)."""

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
        self.writer.flush()

    def step(self, step: int, metrics: dict[str, dict[str, Any]], declared: list[dict[str, Any]] | None = None) -> None:
        for role, m in metrics.items():
            prefix = _prefix(role, m)
            values, reason = step_values(m)
            for key, v in values.items():
                self.writer.add_scalar(f"{prefix}/{key}", v, step)
            if reason:
                self.writer.add_text(f"{prefix}/skip_reason", reason, step)
        for tag, v in declared_values(declared).items():
            self.writer.add_scalar(tag, v, step)
        self.writer.flush()  # a step's records are on disk when it ends: a killed run loses none

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run named after the askspec run (offline unless WANDB_MODE says otherwise or an
    API key is configured); a resumed askspec run continues the same W&B run."""

    def __init__(self, project: str, run_id: str, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        # Any: wandb types `mode` as a Literal; the value is a str it checks itself (and
        # where wandb is not installed, mypy sees no types at all)
        mode: Any = os.environ.get("WANDB_MODE") or ("online" if _wandb_key() else "offline")
        # console="off": W&B would otherwise wrap the process's stdout and stderr (the
        # progress line's, and stdout's run directory) to copy them into its run
        self.run = wandb.init(project=project, name=run_id, id=run_id, resume="allow", dir=str(run_dir),
                              config=config, mode=mode,
                              settings=wandb.Settings(console="off"))

    def step(self, step: int, metrics: dict[str, dict[str, Any]], declared: list[dict[str, Any]] | None = None) -> None:
        row: dict[str, Any] = {}
        for role, m in metrics.items():
            prefix = _prefix(role, m)
            values, reason = step_values(m)
            row.update({f"{prefix}/{k}": v for k, v in values.items()})
            if reason:
                row[f"{prefix}/skip_reason"] = reason
        row.update(declared_values(declared))
        if row:
            self.run.log(row, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_key() -> bool:
    """Whether W&B has an API key: WANDB_API_KEY, or a login in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return "api.wandb.ai" in netrc.read_text(encoding="utf-8")
    except OSError:
        return False


def open_loggers(targets: tuple[LogTarget, ...], *, run_id: str, run_dir: Path, config: dict[str, Any]) -> list[StepLogger]:
    out: list[StepLogger] = []
    for t in targets:
        if t.kind == "tensorboard":
            out.append(TensorBoardLogger(Path(t.where) / run_id if t.where else run_dir / "tensorboard", config))
        else:
            out.append(WandbLogger(t.where or str(config.get("experiment") or "askspec"), run_id, run_dir, config))
    return out
