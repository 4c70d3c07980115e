"""A run's training checkpoints as files: where they live in the run directory
(`checkpoints/`: a folder per role and step, `latest.json` naming the newest complete one;
`buffers/` and `stages/`, what the buffers and the stages carry past a step), which step a
resumed run continues after and whether it can be (read without loading the weights), and
the order a step's checkpoint is written in (`RunCheckpoints`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
BUFFERS = "buffers"  # checkpoints/buffers/step-<n>.json: the buffers' state at that step
STAGES = "stages"  # checkpoints/stages/step-<n>.json: what the stages carry past that step (StageState)
NESTED = "nested"  # checkpoints/nested/: the nested schedule's inner loop state (nested.py)


class CheckpointDamaged(Exception):
    """A checkpoint `--resume` needs cannot be read: the message names the file and says
    what to do (an earlier intact checkpoint to continue from, if there is one)."""


def checkpoint_problem(folder: Path, *, optimizer: bool) -> str | None:
    """Why `folder` cannot be resumed from, naming the file; None when its state, config
    and weights (and, with `optimizer`, AdamW's moments) read. Safetensors headers are
    read whole, so a truncated or emptied file is found without loading the weights."""
    from safetensors import safe_open

    if not folder.is_dir():
        return f"{folder} is missing"
    for name in ("trainer_state.json", "config.json"):
        path = folder / name
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"{path} cannot be read ({e.__class__.__name__}: {e})"
    files = sorted(folder.glob("*.safetensors"))
    if not any(p.name != "optimizer.safetensors" for p in files):
        return f"{folder} holds no weights (model.safetensors)"
    if optimizer and not (folder / "optimizer.safetensors").exists():
        return f"{folder / 'optimizer.safetensors'} is missing"
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except Exception as e:  # safetensors raises its own SafetensorError (and OSError)
            return f"{path} is damaged ({e.__class__.__name__}: {e})"
    return None


@dataclass(frozen=True)
class RunCheckpoints:
    """The checkpoints of one run's trained `roles` under `run_dir`/checkpoints.

    A step's checkpoint is written in this order: every role's folder (`folder`; the
    policy saves its weights, optimizer and state there), the state the step carries
    (`write_state`: buffers, stages; the nested loop writes its own), then `commit`, which
    writes latest.json naming the step (the commit point: a kill before it leaves the
    previous checkpoint the newest) and only then removes what the older ones kept."""

    run_dir: Path
    roles: tuple[str, ...]

    @property
    def root(self) -> Path:
        return self.run_dir / CHECKPOINTS

    def folder(self, role: str, step: int) -> Path:
        return self.root / role / f"step-{step}"

    def named_step(self) -> int:
        """The step latest.json names (0: none written)."""
        path = self.root / LATEST
        if not path.exists():
            return 0
        try:
            return int(json.loads(path.read_text(encoding="utf-8"))["step"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointDamaged(f"{path} cannot be read ({e.__class__.__name__}: {e}); it names the newest "
                                    f"checkpoint. Rewrite it as {{\"step\": N}} for the newest step N that every "
                                    f"role has under {path.parent}, then resume again") from None

    def steps_of_every_role(self) -> list[int]:
        """The steps every role has a folder of, in order."""
        per_role = [{int(p.name[5:]) for p in (self.root / role).glob("step-*") if p.name[5:].isdigit() and p.is_dir()}
                    for role in self.roles]
        return sorted(set.intersection(*per_role)) if per_role else []

    def latest(self) -> int:
        """The step `--resume` continues after: the one latest.json names, or, when its
        folders were moved aside (a damaged checkpoint, see resume_problem), the newest
        step every role still has (0: none)."""
        step = self.named_step()
        if step == 0 or all(self.folder(role, step).is_dir() for role in self.roles):
            return step
        return max(self.steps_of_every_role(), default=0)

    def newest_words(self) -> str:
        """'the newest is step N' / 'none was written', for a message."""
        step = self.latest()
        return f"the newest is step {step}" if step else "none was written"

    def resume_problem(self, step: int) -> str | None:
        """Why checkpoint `step` cannot be resumed from, with the earlier intact checkpoint
        to continue from when there is one (and how); None when every role's reads."""
        # the checkpoint latest.json names keeps AdamW's moments; an earlier one resumed from (the
        # named one moved aside) restarts them
        newest = step == self.named_step()
        problems = [p for role in self.roles
                    if (p := checkpoint_problem(self.folder(role, step), optimizer=newest)) is not None]
        if not problems:
            return None
        text = f"checkpoint step {step} cannot be resumed from: {problems[0]}"
        kept = [d for d in (BUFFERS, NESTED) if (self.root / d / f"step-{step}.json").exists()]
        earlier = [m for m in reversed(self.steps_of_every_role()) if m < step and not kept and all(
            checkpoint_problem(self.folder(role, m), optimizer=False) is None for role in self.roles)]
        if not earlier:
            why = (f" (the {' and '.join(kept)} state is kept for the newest checkpoint only)" if kept else "")
            return f"{text}. No earlier checkpoint can be resumed from{why}: start the run again"
        m = earlier[0]
        moves = "; ".join(f"mv {self.folder(role, step)} {self.root / role / f'damaged-step-{step}'}"
                          for role in self.roles)
        again = f"step {step} is" if m + 1 == step else f"steps {m + 1}-{step} are"
        return (f"{text}. Checkpoint step {m} is intact: to continue from it ({again} played again; "
                f"AdamW's moments restart, only the newest checkpoint keeps them), move step {step} aside and "
                f"resume again: {moves}; askspec run --resume {self.run_dir}")

    def write_state(self, kind: str, step: int, state: dict[str, Any]) -> None:
        """What `kind` (BUFFERS, STAGES) carries past `step`, beside its weights."""
        from askspec.runtime.store.layout import write_json_atomic

        (self.root / kind).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / kind / f"step-{step}.json", state)

    def state(self, kind: str, step: int) -> dict[str, Any] | None:
        """What `kind` carried past checkpoint `step` (None: nothing was written)."""
        path = self.root / kind / f"step-{step}.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def commit(self, step: int, keep: int) -> None:
        """Name `step` the newest checkpoint, then drop what only older ones need: their
        buffer and stage state (only the newest is resumed from), their optimizer state,
        and every role's folders past the newest `keep`."""
        from askspec.runtime.store.layout import write_json_atomic

        write_json_atomic(self.root / LATEST, {"step": step, "roles": {r: f"{r}/step-{step}" for r in self.roles}})
        for kind in (BUFFERS, STAGES):
            for old in (self.root / kind).glob("step-*.json"):
                if old.stem[5:].isdigit() and int(old.stem[5:]) < step:
                    old.unlink(missing_ok=True)
        for role in self.roles:
            done = sorted((p for p in (self.root / role).glob("step-*") if p.name[5:].isdigit()),
                          key=lambda p: int(p.name[5:]))
            for old in done[:-1]:  # only the newest keeps the optimizer state (resume needs no other)
                (old / "optimizer.safetensors").unlink(missing_ok=True)
            for old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
