"""job.json: what `askspec compile --target openrlhf` tells the processes of a job, as one
pydantic model per kind of file. A phase folder's `PhaseJob` (the experiment's IR, the
trained role, its group and games, the endpoints of the other roles, what the shipped
askspec_ext installs, ...) is built by generate.py and read by the agent (adapter.py), the
phase-data commands, the inner-loop service, the extension's hooks and the multi-policy
driver; the multi-policy job's top folder has a `MultiJob`. Each reader loads the file
through `read_phase_job` / `read_multi_job`, so a key is spelled in one place and a file
of another askspec version, or not a job file at all, is refused with a sentence naming
the file and what to do (compile the job again), never a KeyError in a Ray worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from askspec.ir import model as ir

FILE = "job.json"
FORMAT: Literal[1] = 1  # the layout below; a reader refuses another (a job compiled by another askspec version)


class JobFileError(ValueError):
    """A job.json this askspec cannot read: the message names the file and the remedy."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def text(self) -> str:
        """The file's text (a field left None is left out)."""
        return json.dumps(self.model_dump(mode="json", exclude_none=True), indent=1, ensure_ascii=False) + "\n"


_M = TypeVar("_M", bound=_Model)


class Endpoint(_Model):
    """Where a role or model the trained role's games ask is answered (the agent binds it
    as `askspec run` would: a frozen server, a replay file, a python callable, ...)."""

    backend: str
    weights: str
    options: dict[str, Any] = Field(default_factory=dict)


class Endpoints(_Model):
    roles: dict[str, Endpoint] = Field(default_factory=dict)
    models: dict[str, Endpoint] = Field(default_factory=dict)


class InnerLoop(_Model):
    """A nested schedule's outer role: the agent asks the job's inner-loop service (a named
    Ray actor, inner_loop.py) for each session's outer rewards."""

    service: str
    role: str
    games: list[str]


class PhaseJob(_Model):
    """One phase folder's job file."""

    format: Literal[1]
    experiment: dict[str, Any]  # the IR as JSON (`ir()`): data paths outside the spec's folder absolute
    experiment_hash: str
    trained_role: str
    group: int
    games: list[str]
    siblings: dict[str, int] = Field(default_factory=dict)  # game -> N of its `sample N ask` siblings (one session)
    seed: int = 0
    endpoints: Endpoints = Field(default_factory=Endpoints)
    spec_files: dict[str, str] = Field(default_factory=dict)
    replay: dict[str, Any] | None = None  # a phase whose game replays a buffer (phase_data.py)
    extension: dict[str, Any] = Field(default_factory=dict)  # what askspec_ext installs (askspec_ext/pinned.py)
    sample_calls: dict[str, int] = Field(default_factory=dict)  # game -> K `sample N ask` calls of a session
    inner_loop: InnerLoop | None = None
    draw: dict[str, Any] | None = None  # a pushing phase of an alternating schedule (phase_data.py)

    def ir(self) -> ir.Experiment:
        return ir.Experiment.model_validate(self.experiment)


class MultiJob(_Model):
    """The multi-policy job's top folder: each trained role's phase folder, and the one set
    of extension choices every role's trainer installs."""

    format: Literal[1]
    kind: Literal["multi_policy"]
    roles: dict[str, str]
    extension: dict[str, Any] = Field(default_factory=dict)


def _file(path: str | Path) -> Path:
    """A job file given as the file or its folder."""
    p = Path(path)
    return p / FILE if p.is_dir() else p


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobFileError(f"{path}: no job file here; give a folder written by `askspec compile --target "
                           "openrlhf`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise JobFileError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise JobFileError(f"{path} is not JSON (line {e.lineno}: {e.msg}): compile the job again") from None
    if not isinstance(data, dict):
        raise JobFileError(f"{path} is not a job file (not a JSON object): compile the job again")
    if data.get("format") != FORMAT:
        raise JobFileError(f"{path} has format {data.get('format')!r}; this askspec reads format {FORMAT} (the job "
                           "was compiled by another askspec version, or is not a job file): compile the job again "
                           "with this askspec")
    return data


def _validated(cls: type[_M], data: Mapping[str, Any], where: str) -> _M:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        at = ".".join(str(p) for p in first["loc"]) or "the file"
        raise JobFileError(f"{where}: {at}: {first['msg']} ({e.error_count()} problem(s)); compile the job "
                           "again with this askspec") from None


def read_phase_job(path: str | Path) -> PhaseJob:
    """A phase folder's job.json (`path`: the file or its folder)."""
    p = _file(path)
    data = _load(p)
    if data.get("kind") == "multi_policy":
        raise JobFileError(f"{p} is the multi-policy job's top file, not a phase's: give one of its role folders "
                           f"({', '.join(sorted(data.get('roles') or {}))})")
    return _validated(PhaseJob, data, str(p))


def read_multi_job(path: str | Path) -> MultiJob:
    """The multi-policy job's top job.json (`path`: the file or its folder)."""
    p = _file(path)
    return _validated(MultiJob, _load(p), str(p))


def extension_of(path: str | Path) -> dict[str, Any]:
    """What a job file (a phase's or the multi-policy job's top one) asks of askspec_ext."""
    p = _file(path)
    data = _load(p)
    job: MultiJob | PhaseJob = (_validated(MultiJob, data, str(p)) if data.get("kind") == "multi_policy"
                                else _validated(PhaseJob, data, str(p)))
    return dict(job.extension)


def as_phase_job(job: PhaseJob | Mapping[str, Any]) -> PhaseJob:
    """A phase job given as the model or as the file's parsed JSON (a hook handed its job)."""
    return job if isinstance(job, PhaseJob) else _validated(PhaseJob, job, FILE)
