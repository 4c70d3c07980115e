"""`askspec run`'s options as one typed, validated record, built from the command line
(`RunOptions.from_args`) or from keyword arguments (`RunOptions.from_kwargs`, for
`run_spec` in tests and bench scripts), and the exit codes the command promises."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from askspec.ir.vocab import BACKENDS as BACKEND_KINDS

# Exit codes of `askspec run` (documented in the README).
EXIT_OK = 0  # the run finished and at least one session succeeded
EXIT_ERROR = 1  # a usage or configuration error, or a run that failed
EXIT_NO_SESSION_SUCCEEDED = 3  # the run finished but every session ended in error
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM: everything so far is recorded; --resume continues

MAX_SEED = 2**63 - 1  # the store keeps seeds as BIGINT


class UsageError(Exception):
    """A bad flag, a bad value or a combination that cannot work: one `error:` line, exit 1."""


# --log: parsed here, with the other flags; the loggers themselves are commands/loggers.py
KINDS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # --log kind -> the package it needs (and the extra)


@dataclass(frozen=True)
class LogTarget:
    kind: str  # tensorboard | wandb
    where: str | None  # tensorboard: the folder; wandb: the project


def parse_log(value: str) -> LogTarget:
    """`tensorboard`, `tensorboard:DIR`, `wandb` or `wandb:PROJECT` (a UsageError otherwise,
    or when the package is not installed)."""
    kind, sep, where = value.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UsageError(f"--log {value!r}: one of tensorboard[:DIR], wandb[:PROJECT]")
    if sep and not where.strip():
        raise UsageError(f"--log {value!r}: give a {'folder' if kind == 'tensorboard' else 'project'} after the ':', "
                         f"or leave the ':' out")
    package = KINDS[kind]
    if importlib.util.find_spec(package) is None:
        raise UsageError(f"--log {kind} needs the {package} package, which is not installed: "
                         f"pip install 'askspec[{package}]'")
    return LogTarget(kind, where.strip() or None)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for a close candidate, else ''."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_pairs(items: Iterable[str] | Mapping[str, Any] | str | None, flag: str,
                bare: bool = False, form: str = "NAME=VALUE") -> dict[str, str]:
    """NAME=VALUE items (a mapping is taken as is). With `bare`, a lone VALUE is allowed
    and kept under the key '' (--served-model NAME: every openai model)."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    out = {}
    for item in [items] if isinstance(items, str) else items:
        name, sep, value = str(item).partition("=")
        if not sep and bare:
            name, value = "", name
        if (not sep and not bare) or (sep and not name.strip()) or (bare and not value.strip()):
            raise UsageError(f"{flag} takes {form}, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def parse_served(items: Iterable[str] | Mapping[str, str] | str | None) -> dict[str, str]:
    """--served-model NAME (every openai model) or ROLE_OR_MODEL=NAME."""
    return parse_pairs(items, "--served-model", bare=True, form="NAME or ROLE_OR_MODEL=NAME")


@dataclass(frozen=True)
class RunOptions:
    """Everything `askspec run` was asked to do; validated when built."""

    file: str | None = None
    backend: str | None = None
    models: dict[str, str] = field(default_factory=dict)  # --model ROLE=SPEC
    sessions: int | None = None
    seed: int | None = None
    overrides: dict[str, str] = field(default_factory=dict)  # --set NAME=VALUE
    data: dict[str, str] = field(default_factory=dict)  # --data NAME=FILE: a user's file for a data block
    profile: str | None = None  # --profile NAME: one of the spec's configurations
    out: str = "runs"
    replay: str | None = None
    concurrency: int = 8
    resume: str | None = None
    max_tokens: int | None = None
    base_url: str | None = None
    served_models: dict[str, str] = field(default_factory=dict)  # '' -> every openai model
    endpoints: dict[str, str] = field(default_factory=dict)  # --endpoint ROLE_OR_MODEL=URL: its own server
    quiet: bool = False
    verbose: bool = False
    eval_only: bool = False  # play a spec with train blocks without training
    stage: str | None = None  # --stage NAME: play one evaluate stage's sessions (with --eval-only)
    weights: str | None = None  # --weights trained|initial: what a --stage run's sessions are recorded as
    promotions: str | None = None  # --promotions FILE: a retrain stage's promoted datasets (an inner-loop service's state)
    log: tuple[str, ...] = ()  # --log tensorboard[:DIR] | wandb[:PROJECT] (commands/loggers.py)

    def __post_init__(self) -> None:
        def whole(name: str, value: Any, minimum: int, flag: str) -> None:
            if value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{flag} takes a whole number, got {value!r}")
            if value < minimum:
                raise UsageError(f"{flag} must be at least {minimum}, got {value}")

        whole("sessions", self.sessions, 1, "--sessions")
        whole("concurrency", self.concurrency, 1, "--concurrency")
        whole("max_tokens", self.max_tokens, 1, "--max-tokens")
        whole("seed", self.seed, 0, "--seed")
        if self.seed is not None and self.seed > MAX_SEED:
            raise UsageError(f"--seed must be at most {MAX_SEED}, got {self.seed}")
        if self.backend is not None and self.backend not in BACKEND_KINDS:
            raise UsageError(f"--backend {self.backend!r}: no such backend{did_you_mean(self.backend, BACKEND_KINDS)}; "
                             f"backends: {', '.join(BACKEND_KINDS)}")
        if self.replay and self.backend not in (None, "replay"):
            raise UsageError(f"--replay answers every model from a recording; it cannot be combined with "
                             f"--backend {self.backend}")
        if self.base_url is not None:
            if not self.base_url.startswith(("http://", "https://")):
                raise UsageError(f"--base-url wants an http:// or https:// URL, got {self.base_url!r} "
                                 "(e.g. http://localhost:8000/v1)")
            if self.backend not in (None, "openai"):
                raise UsageError(f"--base-url points openai models at a server; it does not apply to "
                                 f"--backend {self.backend}")
        for name, url in self.endpoints.items():
            if not url.startswith(("http://", "https://")) or self.backend not in (None, "openai"):
                raise UsageError(f"--endpoint {name}={url}: an http:// or https:// URL of an openai server, without "
                                 f"another --backend")
        if self.served_models and self.backend not in (None, "openai"):
            raise UsageError(f"--served-model names models on an openai server; it does not apply to "
                             f"--backend {self.backend}")
        if not self.file and not self.resume:
            raise UsageError("give a spec file (or --resume RUN_DIR)")
        if self.stage is not None and self.sessions is not None:
            raise UsageError("--stage plays every session of the stage: it cannot be combined with --sessions")
        if self.weights is not None and (self.stage is None or self.weights not in ("trained", "initial")):
            raise UsageError(f"--weights is trained or initial, with --stage; got {self.weights!r}")
        if self.weights is not None and not self.eval_only:
            raise UsageError("--weights chooses the weights an evaluate stage plays (--eval-only --stage); a retrain "
                             "stage trains the models as given (--model ROLE=hf:CHECKPOINT)")
        if self.promotions is not None and (self.stage is None or self.eval_only):
            raise UsageError("--promotions gives a retrain stage on promoted datasets (`promoted = true`) the "
                             "datasets to train on: use it with --stage NAME, without --eval-only")
        for value in self.log:
            parse_log(value)  # a bad value, or a missing package, before anything starts

    # ------------------------------------------------------------------ building

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        return cls(file=args.file, backend=args.backend, models=parse_pairs(args.model, "--model"),
                   sessions=args.sessions, seed=args.seed, overrides=parse_pairs(args.set, "--set"), out=args.out,
                   data=parse_pairs(getattr(args, "data", None), "--data", form="NAME=FILE"),
                   profile=getattr(args, "profile", None),
                   replay=args.replay, concurrency=args.concurrency, resume=args.resume, max_tokens=args.max_tokens,
                   base_url=_url(args.base_url), served_models=parse_served(args.served_model), quiet=args.quiet,
                   endpoints={k: str(_url(v)) for k, v in parse_pairs(getattr(args, "endpoint", None), "--endpoint",
                                                                     form="ROLE_OR_MODEL=URL").items()},
                   verbose=args.verbose, eval_only=getattr(args, "eval_only", False),
                   stage=getattr(args, "stage", None), weights=getattr(args, "weights", None),
                   promotions=getattr(args, "promotions", None),
                   log=tuple(getattr(args, "log", None) or ()))

    @classmethod
    def from_kwargs(cls, file: str | None = None, **options: Any) -> RunOptions:
        """The command line's options as keyword arguments, under their flag names
        (set=["probes=1"] or {"probes": "1"}, model=..., served_model=...), quiet by default."""
        renamed = {"set": "overrides", "model": "models", "served_model": "served_models", "endpoint": "endpoints"}
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {"quiet": True}
        for key, value in options.items():
            name = renamed.get(key, key)
            if name not in fields or name == "file":
                known = sorted((fields - {"file", "overrides", "models", "served_models", "endpoints"}) | set(renamed))
                raise TypeError(f"run_spec: unknown option {key!r}{did_you_mean(key, known)}")
            kwargs[name] = value
        kwargs["overrides"] = parse_pairs(kwargs.get("overrides"), "--set")
        kwargs["data"] = parse_pairs(kwargs.get("data"), "--data", form="NAME=FILE")
        kwargs["models"] = parse_pairs(kwargs.get("models"), "--model")
        kwargs["served_models"] = parse_served(kwargs.get("served_models"))
        kwargs["endpoints"] = {k: str(_url(v)) for k, v in
                               parse_pairs(kwargs.get("endpoints"), "--endpoint", form="ROLE_OR_MODEL=URL").items()}
        kwargs["base_url"] = _url(kwargs.get("base_url"))
        log = kwargs.get("log") or ()
        kwargs["log"] = (log,) if isinstance(log, str) else tuple(log)
        return cls(file=file, **kwargs)

    # ------------------------------------------------------------------ resume

    def recorded(self) -> dict[str, Any]:
        """What the manifest keeps (`run_options`), so that a resume runs the same way."""
        return {"backend": self.backend, "replay": os.path.abspath(self.replay) if self.replay else None,
                "sessions": self.sessions, "max_tokens": self.max_tokens, "models": dict(self.models),
                "base_url": self.base_url, "served_models": dict(self.served_models),
                "endpoints": dict(self.endpoints),
                "data": {k: os.path.abspath(v) for k, v in self.data.items()},
                "concurrency": self.concurrency, "profile": self.profile, "log": list(self.log),
                "eval_only": self.eval_only, "stage": self.stage, "weights": self.weights,
                "promotions": os.path.abspath(self.promotions) if self.promotions else None}

    def resumed(self, saved: Mapping[str, Any]) -> RunOptions:
        """These options completed by an earlier run's recorded ones (the flags given now
        win, except the endpoint: a resumed run must ask the same server)."""
        saved_url = saved.get("base_url")
        if self.base_url is not None and self.base_url != saved_url:
            before = f"--base-url {saved_url}" if saved_url else "without --base-url"
            raise UsageError(f"refusing to resume {self.resume}: it ran {before}, and its remaining sessions must "
                             f"come from the same server as its first ones (start a new run to use {self.base_url})")
        changes: dict[str, Any] = {}
        for key in ("backend", "replay", "sessions", "max_tokens", "base_url", "profile", "stage",
                    "weights", "promotions"):
            if getattr(self, key) is None and saved.get(key) is not None:
                changes[key] = saved[key]
        if saved.get("eval_only") is True and not self.eval_only:
            changes["eval_only"] = True  # (an evaluate stage's run is an --eval-only run; a retrain stage's trains)
        if not self.models and saved.get("models"):
            changes["models"] = dict(saved["models"])
        if not self.data and saved.get("data"):
            changes["data"] = dict(saved["data"])  # the same files: the experiment hash has their digests
        if not self.served_models and saved.get("served_models"):
            changes["served_models"] = dict(saved["served_models"])
        if not self.endpoints and saved.get("endpoints"):
            changes["endpoints"] = dict(saved["endpoints"])
        if not self.log and saved.get("log"):
            changes["log"] = tuple(saved["log"])
        return dataclasses.replace(self, **changes) if changes else self


def _url(value: str | None) -> str | None:
    return value.rstrip("/") if isinstance(value, str) and value else value
