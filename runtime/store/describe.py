"""How a run's manifest reads to a person: the models each role ran on, the flags it was
started with, and its JSON columns decoded. `askspec runs` and the TUI's run views say
the same things with these."""

from __future__ import annotations

import json
from typing import Any


def json_value(value: Any) -> Any:
    """A JSON column's value decoded (a value that is not JSON text: None, as a corrupt
    one); anything not a string as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def models_text(roles: Any) -> str:
    """'hf:smollm2-135m-instruct (questioner, key); openai:qwen@http://host/v1 (judge)'."""
    if not isinstance(roles, dict):
        return ""
    by_model: dict[str, list[str]] = {}
    for role, info in roles.items():
        info = info if isinstance(info, dict) else {}
        models = [m for m in info.get("models") or [] if isinstance(m, dict)]
        names = [_model_text(m) for m in models] or ([str(info["model"])] if info.get("model") else [])
        for name in names:
            by_model.setdefault(name, []).append(str(role))
    return "; ".join(f"{name} ({', '.join(roles_)})" for name, roles_ in by_model.items())


def _model_text(m: dict) -> str:
    text = f"{m.get('backend')}:{m.get('model')}"
    return f"{text}@{m['endpoint']}" if m.get("endpoint") else text


def settings_text(options: Any, overrides: Any, seed: Any = None) -> str:
    """The flags a run was started with, as one would type them again: the seed it ran
    with, the profile its IR is (the spec's default one included, where the manifest
    records it) and --eval-only first."""
    options = options if isinstance(options, dict) else {}
    parts = []
    if isinstance(seed, int) and not isinstance(seed, bool):
        parts.append(f"--seed {seed}")
    for key in ("profile", "backend", "sessions", "max_tokens", "concurrency", "base_url", "replay"):
        if options.get(key) is not None:
            parts.append(f"--{key.replace('_', '-')} {options[key]}")
    if options.get("eval_only") is True:
        parts.append("--eval-only")
    for key in ("stage", "weights"):  # one evaluate stage (an OpenRLHF job's evaluate.sh)
        if isinstance(options.get(key), str):
            parts.append(f"--{key} {options[key]}")
    for role, spec in (options.get("models") or {}).items():
        parts.append(f"--model {role}={spec}")
    for key, name in (options.get("served_models") or {}).items():
        parts.append(f"--served-model {f'{key}=' if key else ''}{name}")
    for name, path in (options.get("data") or {}).items():
        parts.append(f"--data {name}={path}")
    for name, value in (overrides or {}).items() if isinstance(overrides, dict) else []:
        parts.append(f"--set {name}={json.dumps(value) if not isinstance(value, str) else value}")
    return " ".join(parts)
