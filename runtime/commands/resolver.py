"""Which backend answers each role: (role, model name) -> a ModelBinding, honouring
--backend, --model, --replay, --max-tokens, --base-url, --endpoint and --served-model.

Backend option names are each backend's own business (`Backend.spec_options`, through
the registry); this module only decides which backend and which model a role gets,
records what it chose (`info`), and prepares the models a run starts with.

torch's CPU threads are the process's (with torch's OpenMP build, each thread takes the
number set last when it first runs torch code), so no backend sets them: with
`set_torch_threads`, the first model bound that runs torch here (`Backend.torch_threads`)
sets them, from the event loop's thread, before that model's load and worker threads
start."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

from askspec.ir import model as ir
from askspec.terminal import printable

from askspec.runtime.backends.base import Backend, BackendError, SpecContext
from askspec.runtime.commands.options import BACKEND_KINDS, RunOptions

BindInfo = dict[str, Any]  # {"name", "backend", "model", "endpoint"}: what the manifest records


class ModelResolver:
    """Maps (role, model name) to a backend binding; shares one binding per pair."""

    def __init__(self, exp: ir.Experiment, options: RunOptions, spec_dir: str, *,
                 default_base_url: str | None = None, warn: Callable[[str], None] | None = None,
                 set_torch_threads: bool = False) -> None:
        self.exp = exp
        self.options = options
        self.context = SpecContext(spec_dir=spec_dir, base_url=options.base_url, default_base_url=default_base_url,
                                   replay=options.replay)
        self.warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
        self.on_bind: Callable[[str, BindInfo], None] | None = None  # a new (role, model) pair was bound
        self.bound: dict[str, list[BindInfo]] = {}  # role -> the models it ran on
        self._bindings: dict[tuple[str, str | None], Any] = {}
        self._served: dict[str, list[str]] = {}  # endpoint -> the models it lists (learned by prepare)
        self._warned: set[str] = set()
        self.set_torch_threads = set_torch_threads
        self.torch_threads: int | None = None  # what this run set torch's CPU threads to

    # ------------------------------------------------------------------ binding
    def resolve(self, role: str, name: str | None):
        binding = self._bindings.get((role, name))
        if binding is None:
            binding, info = self._resolve(role, name)
            self._bindings[(role, name)] = binding
            if info is not None and self.on_bind is not None:  # told once the binding is listed
                self.on_bind(role, info)
        return binding

    def bindings(self) -> dict[tuple[str, str | None], Any]:
        """Every (role, model name) bound so far, with its ModelBinding."""
        return dict(self._bindings)

    def _target(self, role: str, name: str | None) -> tuple[str, str, str, str, dict, Backend, bool]:
        """(model name, declared backend, backend kind, weights, sampling, backend, declared?)"""
        from askspec.runtime.backends.registry import backend_for_spec
        from askspec.runtime.engine.session import SessionFailed

        spec_model = self.exp.model(name) if name is not None else None
        name = self.options.models.get(role, name)
        if name is None:
            raise SessionFailed(f"role '{role}' has no model: bind it in the game or pass --model {role}=...")
        m = self.exp.model(name)
        # `current(R)` serves R's weights: the ones `--model R=...` swapped in, if any
        tracked = self.options.models.get(m.weights_of) if m is not None and m.weights_of else None
        declared: str  # a backend kind: the model's, a --model value's or the spec's (the registry refuses others)
        if tracked is not None and role not in self.options.models:
            assert m is not None  # `tracked` is looked up from m.weights_of
            other = self.exp.model(tracked)
            if other is not None:
                declared, weights = other.backend, other.weights
            else:
                declared, weights = (tracked.split(":", 1) if ":" in tracked
                                     else (str(self.exp.options.get("backend", "hf")), tracked))
            sampling, spec_options = dict(m.sampling), {}
        elif m is not None:
            declared, weights, sampling, spec_options = m.backend, m.weights, dict(m.sampling), dict(m.options)
        elif ":" in name and name.split(":", 1)[0] in BACKEND_KINDS:
            declared, weights = name.split(":", 1)
            # other weights under the spec's sampling for this role (the paper's temperature
            # and budgets hold when `--model ROLE=hf:FOLDER` swaps in the paper's model)
            sampling, spec_options = dict(spec_model.sampling) if spec_model is not None else {}, {}
        else:
            declared, weights, sampling, spec_options = str(self.exp.options.get("backend", "hf")), name, {}, {}
        kind = "replay" if self.options.replay else (self.options.backend or declared)
        if declared == "python" and kind != "replay":
            # a python model is code, not weights: no server or hf can load it, so
            # --backend moves only the models that have weights (--replay answers all)
            kind = "python"
        context = self.context
        url = self.options.endpoints.get(role) or self.options.endpoints.get(name)
        if url is not None and kind == "openai":  # --endpoint: this role's or model's own server
            context = dataclasses.replace(context, base_url=url)
        if kind == "replay" and m is None and not context.replay:
            # --model ROLE=replay:FILE: a recording named on the command line, the user's own
            # path like --replay's (a spec's is confined to its folder)
            context = dataclasses.replace(context, replay=weights)
        try:  # the registry shares one backend per (kind, weights, options)
            backend = backend_for_spec(kind, weights, spec_options, context)
        except BackendError as e:
            raise SessionFailed(str(e)) from None
        return name, declared, kind, weights, sampling, backend, m is not None or ":" in name

    def _resolve(self, role: str, name: str | None):
        from askspec.runtime.engine.session import ModelBinding

        name, declared, kind, weights, sampling, backend, named = self._target(role, name)
        asked, label = weights, (name if named else f"{kind}:{weights}")
        if backend.endpoint is not None:  # a server: record which model it was asked for, and where
            asked = self._served_name(role, name, declared, kind, weights, backend.endpoint)
            label = f"{asked}@{backend.endpoint}"
        bound_name = name if named else f"{kind}:{weights}"
        info = {"name": bound_name, "backend": kind, "model": asked, "endpoint": backend.endpoint}
        new = info not in self.bound.setdefault(role, [])
        if new:
            self.bound[role].append(info)
        binding = ModelBinding(name=bound_name, backend=backend, weights=asked, sampling=sampling, label=label,
                               max_tokens_cap=self.options.max_tokens or None)
        if self.set_torch_threads:
            self._set_torch_threads(backend)
        return binding, (info if new else None)

    def _set_torch_threads(self, backend: Backend) -> None:
        """Once per run, from the first model that runs torch in this process (a spec has
        no thread setting: every hf model asks for hf.default_threads())."""
        if self.torch_threads is not None:
            return
        wanted = backend.torch_threads()
        if wanted is not None:
            import torch

            torch.set_num_threads(wanted)
            self.torch_threads = wanted

    def _served_name(self, role: str, name: str, declared: str, kind: str, weights: str, endpoint: str) -> str:
        """The model name a server is asked for: --served-model for the role, the model or
        every model; else the spec's own name when the spec declared a server model; else
        the weights name if the server lists it, or the one model it lists."""
        from askspec.runtime.engine.session import SessionFailed

        served = self.options.served_models
        for key in (role, name, ""):
            if key in served:
                return served[key]
        if declared == kind:
            return weights
        listed = self._served.get(endpoint)
        if listed:
            if weights in listed:
                return weights
            if len(listed) == 1:
                self._note(f"listed:{endpoint}", f"model '{name}' ({declared} weights {weights!r}) runs as "
                                                 f"{listed[0]!r}, the one model {endpoint} serves")
                return listed[0]
            raise SessionFailed(f"{endpoint} serves {', '.join(map(repr, listed))}, not {weights!r} (the {declared} "
                                f"weights of model '{name}'): pick one with --served-model {role}=NAME")
        self._note(f"asked:{endpoint}:{weights}",
                   f"model '{name}' runs on {endpoint} under its {declared} weights name {weights!r}; if the server "
                   f"serves another name, give it with --served-model NAME")
        return weights

    def _note(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warn(printable(message, single_line=True))

    # ------------------------------------------------------------------ start of a run
    def static_roles(self) -> dict[str, str]:
        """Roles whose model is known before any session runs (declared or --model)."""
        out = {}
        for r in self.exp.roles:
            name = self.options.models.get(r.name, r.model)
            if name is not None:
                out[r.name] = name
        return out

    async def prepare(self, line: Callable[[str], Callable[[str], None]]) -> None:
        """Bind every role whose model is known now and get its backend ready: learn what
        a server lists (for models moved there by --backend openai), load local weights.
        `line(text)` starts one progress line and returns the function that ends it.
        Raises SessionFailed / BackendError for a model that cannot work."""
        for role, name in self.static_roles().items():
            _, declared, kind, _, _, backend, _ = self._target(role, name)
            endpoint = backend.endpoint
            if endpoint is not None and declared != kind and endpoint not in self._served and not self.options.served_models:
                try:
                    self._served[endpoint] = await backend.served_models()  # type: ignore[attr-defined]
                except (BackendError, AttributeError) as e:
                    self._served[endpoint] = []
                    self.warn(printable(str(e), single_line=True))
            self.resolve(role, name)
        ready: set[int] = set()
        for role, name in self.static_roles().items():
            binding = self.resolve(role, name)
            backend = binding.backend
            if id(backend) in ready:
                continue
            ready.add(id(backend))
            steps = backend.preparation()
            for k, (what, run) in enumerate(steps):
                last = k == len(steps) - 1  # the step that makes the model ready (the load)
                end = line(f"preparing {type(backend).name} model {binding.weights} ({binding.name}, role {role}) ..."
                           if last else f"{what} ...")
                t0 = time.monotonic()
                await run()
                end(f" {'ready' if last else 'done'} in {time.monotonic() - t0:.1f} s")

    async def aclose(self) -> None:
        from askspec.runtime.backends.registry import aclose_backends

        await aclose_backends()


def local_resolver(exp: ir.Experiment, spec_dir: str) -> ModelResolver:
    """A resolver of `exp`'s models as `askspec run` binds them by default (the spec's own
    backends), for a process that trains in place of the command: the OpenRLHF job's
    inner-loop service (runtime/targets/openrlhf/inner_loop.py)."""
    import os

    return ModelResolver(exp, RunOptions(file=os.path.join(spec_dir, "spec.ask")), spec_dir)
