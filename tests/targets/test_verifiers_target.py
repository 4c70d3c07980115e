"""`askspec compile --target verifiers`: the generated package is loaded by verifiers 0.4.0's
own loader and evaluated by its own entry point (`run_eval`) against the loopback
OpenAI-compatible test server, each role's calls through its agent's interception endpoint;
each role's reward equals what `askspec run --backend replay` records for the same replies.
And what cannot map is refused at the spec's lines."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.commands.run import run_spec
from askspec.runtime.scoring.trajectory import trajectory_return
from askspec.runtime.store.views import open_store

from fake_openai_server import FakeOpenAIServer

# scripts/setup.sh installs verifiers 0.4.0; a venv that predates that line skips these tests, CI fails them
if importlib.util.find_spec("verifiers") is None and not os.environ.get("CI"):
    pytest.skip("verifiers 0.4.0 is not installed (run scripts/setup.sh)", allow_module_level=True)

SPECS = Path(__file__).resolve().parent / "specs"
GOLDEN = Path(__file__).resolve().parent / "golden"
PACKAGE = "verifiers_duel"
# Two roles: a trained solver and a frozen checker, each rewarded from the replies (the test
# server echoes the last message, so the rewards differ between the sessions). Kept here, not
# in specs/, whose every spec the OpenRLHF tests compile (a trained `openai` model is E606 there).
DUEL = """\
data problems = [{question: "1 + 1", answer: "2"}, {question: "2 + 5", answer: "7"}, {question: "9 - 0", answer: "9"}]

model policy_model = openai("policy-8b") { temperature = 0.7; max_tokens = 32 }
model checker_model = openai("checker-8b") { max_tokens = 16 }

role solver { model = policy_model; trained; memory = full }
role checker { model = checker_model; memory = none }

game duel for item in problems {
    a = ask solver using "What is {{ item.question }}?"
    v = ask checker using "Is {{ item.answer }} the answer in: {{ a.text }}"
    reward solver as right = case { contains(a.text, item.answer) -> 1.0; else -> 0.0 }
    reward checker as agrees = case { contains(v.text, "+") -> 0.5; else -> 0.0 }
    reward solver as fives = case { contains(a.text, "5") -> 0.25; else -> 0.0 }
}

train solver with grpo { lr = 0.000001; steps = 1 }
"""


@pytest.fixture
def duel(tmp_path) -> Path:
    spec = tmp_path / f"{PACKAGE}.ask"
    spec.write_text(DUEL)
    return spec


@pytest.fixture
def package(duel, tmp_path, monkeypatch):
    """The duel spec compiled by the CLI, importable (and forgotten afterwards)."""
    out = tmp_path / "env"
    assert main(["compile", str(duel), "--target", "verifiers", "-o", str(out)]) == 0
    monkeypatch.syspath_prepend(str(out))
    yield out
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


async def evaluate(base_url: str, output_dir: Path):
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    config = EvalConfig.model_validate({
        "env": {"taskset": {"id": PACKAGE}}, "model": "policy-under-training",
        "client": {"type": "eval", "base_url": base_url, "api_key_var": "ASKSPEC_TEST_NO_KEY"},
        "push": False, "rich": None, "output_dir": str(output_dir)})
    return await run_eval(config)


def test_verifiers_evaluates_the_game_with_the_rewards_of_a_replay_run(duel, package, tmp_path):
    async def go():
        async with FakeOpenAIServer() as server:
            episodes = await evaluate(server.base_url, tmp_path / "outputs")
            return episodes, server.bodies

    episodes, bodies = asyncio.run(go())
    module = importlib.import_module(PACKAGE)
    assert {"AskspecEnv", "AskspecTaskset", "AskspecSeat", "AskspecEnvConfig"} <= set(module.__all__)
    assert len(episodes) == 3 and all(e.ok for e in episodes), [e.errors for e in episodes]

    # every call went through verifiers to the server: the trained role's as the run's model,
    # the frozen one's as its spec model
    assert sorted(b["model"] for b in bodies) == ["checker-8b"] * 3 + ["policy-under-training"] * 3
    assert {b["max_tokens"] for b in bodies if b["model"] == "checker-8b"} == {16}
    assert {(b["max_tokens"], b["temperature"]) for b in bodies if b["model"] != "checker-8b"} == {(32, 0.7)}

    recording: dict[int, dict[str, list[str]]] = {}
    got: dict[tuple[int, str], tuple[float, dict]] = {}
    for e in episodes:
        index = e.task.data.index
        assert {t.agent.name: t.agent.trainable for t in e.traces} == {"solver": True, "checker": False}
        for t in e.traces:
            recording.setdefault(index, {})[t.agent.name] = [t.nodes[c.node].message.content for c in t.calls]
            got[(index, t.agent.name)] = (t.reward, dict(t.metrics))
    rec = tmp_path / "recording.json"
    rec.write_text(json.dumps({"sessions": [recording[k] for k in sorted(recording)]}))

    rc, run_dir = asyncio.run(run_spec(str(duel), out=str(tmp_path / "runs"),
                                       replay=str(rec), eval_only=True))
    assert rc == 0
    con = open_store(run_dir)
    rows = con.execute("select session_id, role, turn_index, name, value from rewards").fetchall()
    expected = {}
    for (index, role) in got:
        session = [(r, turn, name, value) for sid, r, turn, name, value in rows if sid == f"s{index:06d}"]
        named: dict[str, float] = {}
        for r, _turn, name, value in session:
            if r == role:
                named[name] = named.get(name, 0.0) + value
        expected[(index, role)] = (trajectory_return(session, role), named)
    assert got == expected
    assert len({v[0] for v in got.values()}) > 1  # the rewards tell the sessions apart


def test_the_package_exports_what_verifiers_loads(package):
    from verifiers.v1.utils.loaders import environment_class, resolve_env_config, taskset_class

    config = resolve_env_config({"taskset": {"id": PACKAGE}})
    assert type(config).__name__ == "AskspecEnvConfig"
    assert config.max_concurrent_agents is None
    assert config.checker.model == "checker-8b" and config.solver.model is None  # frozen pinned, trained the run's
    assert environment_class(PACKAGE).__name__ == "AskspecEnv"
    tasks = list(taskset_class(PACKAGE)(config.taskset))
    assert [t.data.bindings["item"]["question"] for t in tasks] == ["1 + 1", "2 + 5", "9 - 0"]


@pytest.mark.parametrize("spec, code, line", [
    (SPECS / "online_two_roles.ask", "E702", 11),
    (SPECS / "stages.ask", "E704", 19),
    (SPECS / "routes.ask", "E706", 20),
    (SPECS / "buffer_short.ask", "E705", 13),
    (SPECS / "pasodoble_carry.ask", "E708", 20),
])
def test_what_cannot_map_is_refused_at_its_line(spec, code, line, tmp_path, capsys):
    out = tmp_path / "env"
    assert main(["compile", str(spec), "--target", "verifiers", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{spec.name}:{line}:" in err and f"error[{code}]" in err, err
    assert not out.exists()


def test_a_nested_schedule_a_role_named_like_a_config_field_and_a_scripted_role_are_refused(tmp_path, capsys):
    spec = tmp_path / "clash.ask"
    spec.write_text('model m = openai("x")\nrole timeout { model = m }\ngame g { a = ask timeout using "hi" }\n')
    assert main(["compile", str(spec), "--target", "verifiers", "-o", str(tmp_path / "env")]) == 1
    err = capsys.readouterr().err
    assert "clash.ask:2:6: error[E707]" in err
    assert main(["compile", str(GOLDEN / "E602_nested.ask"), "--target", "verifiers",
                 "-o", str(tmp_path / "env2")]) == 1
    assert "error[E703]" in capsys.readouterr().err
    scripted = tmp_path / "scripted.ask"
    scripted.write_text('model p = openai("policy")\nmodel s = python("unused:reply")\n'
                        'role solver { model = p; trained }\nrole oracle { model = s }\n'
                        'game g { a = ask solver using "hi"\n b = ask oracle using "{{ a.text }}"\n'
                        ' reward solver = case { contains(b.text, "yes") -> 1.0; else -> 0.0 } }\n')
    assert main(["compile", str(scripted), "--target", "verifiers", "-o", str(tmp_path / "env3")]) == 1
    assert "scripted.ask:4:6: error[E709]" in capsys.readouterr().err


def test_openrlhf_only_flags_are_usage_errors(duel, tmp_path, capsys):
    rc = main(["compile", str(duel), "--target", "verifiers", "--max-len", "64",
               "-o", str(tmp_path / "env")])
    assert rc == 1 and "--max-len only applies with --target openrlhf" in capsys.readouterr().err


def test_a_failing_model_call_is_the_episodes_error(package, tmp_path):
    async def go():
        async with FakeOpenAIServer(script=["400"] * 10) as server:
            return await evaluate(server.base_url, tmp_path / "outputs")

    episodes = asyncio.run(go())
    assert len(episodes) == 3
    for e in episodes:
        assert not e.ok
        assert any(f"session {e.task.data.session_id}" in err.message for err in e.errors), e.errors
        assert all(not t.rewards for t in e.traces)  # no reward for a session that did not finish


def test_a_frozen_role_on_a_server_is_pinned_to_it(tmp_path):
    spec = tmp_path / "pinned.ask"
    spec.write_text('model p = openai("policy")\n'
                    'model j = openai("judge-8b", base_url = "http://judge:8000/v1", api_key_env = "JUDGE_KEY")\n'
                    'role solver { model = p; trained }\nrole judge { model = j }\n'
                    'game g { a = ask solver using "hi"\n b = ask judge using "{{ a.text }}"\n'
                    ' reward solver = case { contains(b.text, "yes") -> 1.0; else -> 0.0 } }\n')
    assert main(["compile", str(spec), "--target", "verifiers", "-o", str(tmp_path / "env")]) == 0
    game = json.loads((tmp_path / "env" / "pinned" / "game.json").read_text())
    assert game["trained"] == "solver"
    assert game["pins"] == {"judge": {"model": "judge-8b", "client": {
        "type": "eval", "base_url": "http://judge:8000/v1", "api_key_var": "JUDGE_KEY"}}}
