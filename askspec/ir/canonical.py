"""Canonical JSON and the content hash of an IR.

The hash covers everything that changes what an experiment does (prompts included) and
nothing that only changes how the spec is written: spans are dropped, keys sorted."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .model import Experiment


# Fields added to the IR after specs were hashed, left out while unset: a spec that does
# not use them keeps the hash it had (and a run recorded before them can be resumed).
_UNSET_LEFT_OUT = frozenset({"max_prompt_tokens", "prompt_overflow", "conversation", "role_sampling", "user_file"})


def _strip_spans(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_spans(v) for k, v in value.items()
                if k != "span" and not (v is None and k in _UNSET_LEFT_OUT)}
    if isinstance(value, list):
        return [_strip_spans(v) for v in value]
    return value


def canonical_data(ir: Experiment) -> dict:
    return _strip_spans(ir.model_dump(mode="json"))


def canonical_json(ir: Experiment) -> str:
    return json.dumps(canonical_data(ir), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def experiment_hash(ir: Experiment) -> str:
    return hashlib.sha256(canonical_json(ir).encode()).hexdigest()


def to_json(ir: Experiment, indent: int | None = 2) -> str:
    """The IR with spans (for tools), plus its hash."""
    data = ir.model_dump(mode="json")
    data["hash"] = experiment_hash(ir)
    return json.dumps(data, indent=indent, ensure_ascii=False)


def from_json(text: str) -> Experiment:
    data = json.loads(text)
    data.pop("hash", None)
    return Experiment.model_validate(data)
