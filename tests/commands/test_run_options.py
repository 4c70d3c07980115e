"""The typed options of `askspec run` and the backends' own option mapping."""

from __future__ import annotations

import asyncio

import pytest

from askspec.runtime.backends.base import SpecContext
from askspec.runtime.backends.registry import aclose_backends, backend_class, backend_for_spec
from askspec.runtime.commands.options import RunOptions, UsageError
from askspec.runtime.commands.run import run_spec


def test_options_from_keywords_are_typed_and_checked():
    opts = RunOptions.from_kwargs("x.ask", set=["probes=1"], model={"a": "hf:x"}, served_model="qwen", sessions=2,
                                  base_url="http://h:1/v1/")
    assert opts.overrides == {"probes": "1"} and opts.models == {"a": "hf:x"}
    assert opts.served_models == {"": "qwen"} and opts.base_url == "http://h:1/v1" and opts.quiet
    with pytest.raises(UsageError, match="--sessions must be at least 1, got 0"):
        RunOptions.from_kwargs("x.ask", sessions=0)
    with pytest.raises(UsageError, match="--concurrency takes a whole number"):
        RunOptions.from_kwargs("x.ask", concurrency=2.5)
    with pytest.raises(UsageError, match="did you mean 'openai'"):
        RunOptions.from_kwargs("x.ask", backend="opnai")
    with pytest.raises(TypeError, match="unknown option 'sesions' \\(did you mean 'sessions'\\?\\)"):
        asyncio.run(run_spec("x.ask", sesions=2))


def test_resume_keeps_the_recorded_options_and_endpoint():
    saved = RunOptions(file="x.ask", backend="openai", sessions=4, base_url="http://a/v1",
                       served_models={"": "m"}).recorded()
    resumed = RunOptions(resume="runs/r").resumed(saved)
    assert (resumed.backend, resumed.sessions, resumed.base_url, resumed.served_models) == (
        "openai", 4, "http://a/v1", {"": "m"})
    with pytest.raises(UsageError, match="it ran --base-url http://a/v1"):
        RunOptions(resume="runs/r", base_url="http://b/v1").resumed(saved)
    # an --eval-only run stays one (its resumed manifest, and `askspec runs`, say so)
    assert RunOptions(resume="runs/r").resumed(RunOptions(file="x.ask", eval_only=True).recorded()).eval_only
    assert not RunOptions(resume="runs/r").resumed(saved).eval_only


def test_each_backend_maps_its_own_spec_options(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://from-env/v1")
    openai = backend_class("openai").spec_options("m", {"concurrency": 3, "retries": 2, "timeout": 5},
                                                  SpecContext())
    assert openai == {"max_concurrency": 3, "attempts": 3, "timeout": 5, "base_url": "http://from-env/v1"}
    ctx = SpecContext(base_url="http://flag/v1", default_base_url="http://recorded/v1")
    assert backend_class("openai").spec_options("m", {"base_url": "http://spec/v1"}, ctx)["base_url"] == "http://flag/v1"
    ctx = SpecContext(default_base_url="http://recorded/v1")
    assert backend_class("openai").spec_options("m", {}, ctx)["base_url"] == "http://recorded/v1"
    assert backend_class("openai").spec_options("m", {"base_url": "http://spec/v1"}, ctx)["base_url"] == "http://spec/v1"

    (tmp_path / "rec.json").write_text('{"sessions": [{"a": ["hi"]}]}')
    replay = backend_for_spec("replay", "rec.json", {}, SpecContext(spec_dir=str(tmp_path)))
    assert replay.path == tmp_path / "rec.json"  # relative to the spec
    assert backend_class("hf").spec_options("x", {"max_batch": 4}, SpecContext()) == {"max_batch": 4}
    asyncio.run(aclose_backends())


def test_the_profile_is_recorded_and_a_resume_uses_it_again():
    saved = RunOptions(file="x.ask", profile="training").recorded()
    assert saved["profile"] == "training"
    assert RunOptions(resume="runs/r").resumed(saved).profile == "training"
    assert RunOptions(resume="runs/r", profile="benchmark").resumed(saved).profile == "benchmark"  # the flag wins
    assert RunOptions.from_kwargs("x.ask", profile="training").profile == "training"
