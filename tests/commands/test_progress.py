"""What `askspec run` tells the user while it runs and when it ends (issue #14, item 5):
tokens are counted while a call generates them, not when its turn ends; preparing a
model shows each of its steps on a line of its own; the run ends with a summary of
sessions by status and outcome, tokens per role, time, speed and the run directory."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from types import SimpleNamespace

from askspec.lang.compiler import compile_source
from askspec.runtime.backends.base import Backend, ChatRequest, ChatResult
from askspec.runtime.commands.progress import Progress
from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.plan import plan_sessions
from askspec.runtime.engine.session import Engine, ModelBinding

SPEC = """
model m = python("unused:reply")
role a { model = m; memory = none; prompt = "q {{ i }}" }
game g for i in range(0, 1) { x = ask a }
"""


class NullRecorder:
    def session_started(self, *a, **k):
        return 1

    def turn(self, *a, **k):
        pass

    reward = session_finished = group = match = buffer_event = turn


class StreamingTestBackend(Backend):
    """Test double of a generating backend: reports 3 tokens from another thread (as the
    hf worker does), then holds the call open until the test lets it finish with 5."""

    name = "streaming-test-double"

    def __init__(self) -> None:
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: ChatRequest) -> ChatResult:
        assert request.on_tokens is not None
        worker = threading.Thread(target=lambda: [request.on_tokens(1) for _ in range(3)])
        worker.start()
        worker.join()
        self.inside.set()
        await self.release.wait()
        return ChatResult(text="#Answer# ok", tokens_in=11, tokens_out=5)


def test_tokens_are_counted_while_a_call_runs_and_not_twice():
    res = compile_source("t.ask", SPEC, {})
    assert res.ok
    exp = res.ir
    backend = StreamingTestBackend()
    progress = Progress(1, 0, quiet=True)
    engine = Engine(exp, params=exp.param_values(), datasets={}, writer=NullRecorder(),
                    resolve_model=lambda role, name: ModelBinding(name="m", backend=backend, weights="w", sampling={}),
                    on_turn=progress.turn, on_tokens=progress.stream_tokens, on_session_done=progress.session)

    async def go():
        task = asyncio.ensure_future(engine.run(plan_sessions(exp, exp.param_values(), {}, 0)))
        await asyncio.wait_for(backend.inside.wait(), 10)
        during = (progress.tokens, progress.turns, progress.done)
        backend.release.set()
        await task
        return during

    during = asyncio.run(go())
    assert during == (3, 0, 0)  # counted, though no turn has ended
    assert progress.tokens == 5  # the 2 it did not stream, added at the end; the 3 not again
    assert progress.roles == {"a": [1, 11, 5]}
    assert "tok/s" in progress.line() and progress.line().startswith("sessions 1/1  turns 1")


def _session(status, outcome):
    return SimpleNamespace(status=status, outcome=outcome, plan=SimpleNamespace(game="g"))


def test_summary_lists_sessions_tokens_time_speed_and_the_run_dir():
    out = io.StringIO()
    progress = Progress(6, 2, quiet=False, stream=out)
    progress.begin()
    for status, outcome in [("ok", "won"), ("ok", "won"), ("ok", "lost"), ("error", None)]:
        progress.session(_session(status, outcome))
    progress.turn("questioner", 400, 90)
    progress.turn("questioner", 600, 96)
    progress.turn("answerer", 120, 30, streamed=30)
    progress.stream_tokens(30)  # what answerer streamed while it ran
    progress.close()
    lines = progress.summary("interrupted", "runs/x\x1b[2Jy")
    assert lines[0].startswith("summary: run interrupted after ")
    assert "s preparing" in lines[0] and "s playing" in lines[0]
    assert lines[1] == "  sessions: 4 played: ok 3 (lost 1, won 2); error 1; 2 finished by an earlier process"
    assert lines[2] == ("  tokens: answerer 120 in / 30 out (1 calls); questioner 1,000 in / 186 out (2 calls); "
                        "total 1,120 in / 216 out")
    assert lines[3] == "  replies: every reply parsed, none truncated"
    assert lines[4].startswith("  speed: ") and "generated tok/s" in lines[4] and "sessions/s" in lines[4]
    assert lines[5] == "  run directory: runs/x\\e[2Jy"  # escaped: a path is not a terminal command
    assert progress.tokens == 216


def test_line_is_refreshed_by_the_timer_while_no_turn_ends(monkeypatch):
    out = io.StringIO()
    progress = Progress(1, 0, quiet=False, stream=out)
    assert progress.interval() == Progress.LOG_INTERVAL_S == 5.0  # not a terminal: a line every 5 s
    monkeypatch.setattr(Progress, "LOG_INTERVAL_S", 0.2)  # the same timer, sooner
    progress.begin()

    async def go():
        ticker = asyncio.ensure_future(progress.tick())
        progress.stream_tokens(7)  # a call is generating; nothing else happens
        await asyncio.sleep(0.5)
        ticker.cancel()

    asyncio.run(go())
    assert "sessions 0/1  turns 0" in out.getvalue() and " tok/s  ETA ?" in out.getvalue()
    assert "0.0 tok/s" not in out.getvalue()


class TwoStepTestBackend(Backend):
    """Test double of a backend that converts weights once, then loads them."""

    name = "two-step-test-double"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def preparation(self):
        async def convert():
            self.ran.append("convert")

        return [("converting weights.gguf (once)", convert), ("loading", self.prepare)]

    async def prepare(self) -> None:
        self.ran.append("load")

    async def complete(self, request):  # pragma: no cover - not called
        raise AssertionError


def test_each_preparation_step_has_its_own_line(tmp_path, monkeypatch):
    from askspec.runtime.commands import resolver as resolver_mod
    from askspec.runtime.commands.options import RunOptions

    res = compile_source("t.ask", SPEC, {})
    backend = TwoStepTestBackend()
    monkeypatch.setattr("askspec.runtime.backends.registry.backend_for_spec", lambda *a, **k: backend)
    resolver = resolver_mod.ModelResolver(res.ir, RunOptions(file="t.ask"), str(tmp_path))
    out = io.StringIO()
    asyncio.run(resolver.prepare(Progress(0, 0, quiet=False, stream=out).step))
    lines = out.getvalue().splitlines()
    assert backend.ran == ["convert", "load"]
    assert len(lines) == 2
    assert lines[0].startswith("converting weights.gguf (once) ... done in ")
    assert lines[1].startswith("preparing two-step-test-double model unused:reply (m, role a) ... ready in ")


def test_hf_lists_the_one_time_conversion_as_its_own_step(tmp_path):
    from askspec.runtime.backends.hf import HFBackend

    fresh = HFBackend("smollm2-135m-instruct", cache_dir=str(tmp_path))  # nothing converted there
    steps = [what for what, _ in fresh.preparation()]
    assert len(steps) == 2 and steps[0].startswith("converting SmolLM2-135M-Instruct.Q4_1.gguf to transformers weights")
    assert steps[1] == "loading"
    (tmp_path / "smollm2-135m-instruct-q4_1").mkdir()
    (tmp_path / "smollm2-135m-instruct-q4_1" / "config.json").write_text("{}")
    assert [what for what, _ in fresh.preparation()] == ["loading"]


def test_a_run_ends_with_its_summary(tmp_path, capsys):
    spec = tmp_path / "g.ask"
    spec.write_text("""
model m = replay("answers.json")
role a { model = m; memory = none; prompt = "q {{ i }}" }
game g for i in range(0, 4) {
    outcomes won, lost
    x = ask a
    if x.answer == "win" { end won }
    end lost
}
""")
    (tmp_path / "answers.json").write_text(json.dumps({"sessions": [{"a": ["win"]}] * 2 + [{"a": ["loss"]}, {}]}))
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), quiet=False))
    assert rc == 0
    err = capsys.readouterr().err
    assert "summary: run finished after " in err
    assert "  sessions: 4 played: ok 3 (lost 1, won 2); error 1\n" in err
    assert "  tokens: a 0 in / 0 out (3 calls); total 0 in / 0 out\n" in err
    assert f"  run directory: {run_dir}\n" in err


def test_every_roles_unparsed_and_truncated_replies_are_counted_and_warned_about():
    """Issue #30 item 6: a frozen role's 30 unparsed replies (15 of them cut at max_tokens)
    are in the summary and warned about; a role under the share is counted, not warned."""
    progress = Progress(1, 0, quiet=True)
    for i in range(30):
        progress.turn("oracle", 10, 5, 0, True, i % 2 == 0)
    for i in range(40):
        progress.turn("solver", 10, 5, 0, i < 2, i == 39)
    progress.turn("judge", 10, 5)
    lines = progress.summary("finished", "runs/x")
    assert ("  replies: oracle 30 of 30 unparsed (15 truncated); solver 2 of 40 unparsed, 1 more truncated"
            in lines)
    assert progress.warnings() == [
        "oracle: 30 of 30 replies did not parse (15 of them cut at max_tokens: raise the role's max_tokens)"]
    cut = Progress(1, 0, quiet=True)
    for i in range(10):
        cut.turn("solver", 10, 5, 0, False, i < 5)
    assert cut.warnings() == ["solver: 5 of 10 replies were cut at max_tokens; raise the role's max_tokens if they "
                              "are meant to end"]
    assert progress.warnings(frozenset({"oracle"})) == []  # a judge the routes warned about already


def test_a_run_warns_about_a_frozen_roles_unparsed_replies(tmp_path, capsys):
    spec = tmp_path / "g.ask"
    spec.write_text("""
model m = replay("answers.json")
role oracle { model = m; memory = none; reply = boxed; prompt = "q {{ i }}" }
game g for i in range(0, 4) {
    x = ask oracle
}
""")
    (tmp_path / "answers.json").write_text(json.dumps({"sessions": [{"oracle": ["no box"]}] * 3
                                                       + [{"oracle": ["\\boxed{1}"]}]}))
    rc, _ = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), quiet=True))
    assert rc == 0
    err = capsys.readouterr().err
    assert "warning: oracle: 3 of 4 replies did not parse; check its prompt against its reply format\n" in err
    rc, _ = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), quiet=False))
    assert "  replies: oracle 3 of 4 unparsed\n" in capsys.readouterr().err
