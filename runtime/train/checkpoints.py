"""A run's training checkpoints as files: where they live in the run directory
(`checkpoints/`: a folder per role and step, `latest.json` naming the newest complete one;
`buffers/` and `stages/`, what the buffers and the stages carry past a step) and whether
one can be resumed from, read without loading its weights."""

from __future__ import annotations

import json
from pathlib import Path

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
BUFFERS = "buffers"  # checkpoints/buffers/step-<n>.json: the buffers' state at that step
STAGES = "stages"  # checkpoints/stages/step-<n>.json: what the stages carry past that step (StageState)


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
