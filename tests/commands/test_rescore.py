"""`askspec rescore RUN --spec NEW.ask`: a recorded run re-scored under a changed reward gives
the rewards a fresh run of the new spec gives, with no call to the models that played; a
judge whose prompt changed is called and the command says so; a changed protocol is
refused at the step's line; the new run records its lineage and the TUI compares the two."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from askspec.runtime.commands.query import query
from askspec.runtime.commands.rescore import rescore
from askspec.runtime.commands.run import run_spec

PLAYERS = '''
CALLS = {"policy": 0, "judge": 0}

def policy(messages, request):
    CALLS["policy"] += 1
    return "I think \\\\boxed{%d}" % (request.session_index % 3 == 0)

def flat(messages, request):
    CALLS["policy"] += 1
    return "\\\\boxed{1}"

def judge(messages, request):
    CALLS["judge"] += 1
    return "Response A is better. \\\\boxed{A}"
'''

SPEC = """
experiment rs {{ param group: int = 4  param weight: number = 1.0 }}
model policy_m = python("rs_players:{policy}")
model judge_m = python("rs_players:judge")
role policy {{ model = policy_m; trained; memory = none; reply = boxed; prompt = "solve {{{{ 1 + 1 }}}}" }}
role judge {{ model = judge_m; memory = none }}
tournament cup {{ judge = judge; prompt = "{judge_prompt} A: {{{{ response_a }}}} B: {{{{ response_b }}}}"; pairing = round_robin; aggregate = win_rate; gamma = {gamma} }}
game solve sample group {{
    outcomes right, wrong
    r = ask policy
    reward policy = case {{ r.answer == "1" -> {reward}; else -> 0.0 }}
    outcome = case {{ r.answer == "1" -> right; else -> wrong }}
    route policy {{ when var(rewards) > 0 -> keep; else -> tournament cup }}
}}
"""


@pytest.fixture
def players(tmp_path, monkeypatch):
    (tmp_path / "rs_players.py").write_text(PLAYERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rs_players", raising=False)
    import rs_players

    return rs_players.CALLS


def _spec(tmp_path: Path, name: str, *, policy="policy", reward="1.0 * weight", judge_prompt="Compare.",
          gamma="0.9", extra="") -> str:
    path = tmp_path / name
    text = SPEC.format(policy=policy, reward=reward, judge_prompt=judge_prompt, gamma=gamma)
    if extra:
        text = text.replace("    r = ask policy\n", "    r = ask policy\n" + extra)
    path.write_text(textwrap.dedent(text))
    return str(path)


def _record(tmp_path: Path, spec: str) -> Path:
    rc, run = asyncio.run(run_spec(spec, eval_only=True, out=str(tmp_path / "runs"), sessions=8))
    assert rc == 0 and run is not None
    return Path(run)


def _rewards(run: Path | str) -> list[tuple]:
    return [tuple(r.values()) for r in query(run, "SELECT session_id, role, name, value FROM rewards "
                                                  "ORDER BY session_id, name").to_pylist()]


def _outcomes(run: Path | str) -> list[tuple]:
    return [tuple(r.values()) for r in query(run, "SELECT session_id, outcome, group_id FROM sessions "
                                                  "ORDER BY session_id").to_pylist()]


def test_changed_reward_weight_gives_a_fresh_runs_rewards(tmp_path, players, capsys):
    source = _record(tmp_path, _spec(tmp_path, "old.ask"))
    played = dict(players)
    new = _spec(tmp_path, "new.ask", reward="2.5 * weight")
    rc, rescored = asyncio.run(rescore(source, new, quiet=False))
    assert rc == 0 and rescored is not None
    assert players == played  # no model was called: every reply was the recording's
    err = capsys.readouterr().err
    assert "mean reward policy" in err  # the side-by-side summary: both runs' means
    rc, fresh = asyncio.run(run_spec(new, eval_only=True, out=str(tmp_path / "fresh"), sessions=8))
    assert rc == 0
    got, want = _rewards(rescored), _rewards(fresh)
    assert got == want and any(v == 2.5 for *_, v in got)  # the new weight, not the recorded 1.0
    assert got != _rewards(source)
    assert _outcomes(rescored) == _outcomes(fresh)
    texts = "SELECT session_id, role, text FROM turns ORDER BY session_id, turn_index"
    assert query(rescored, texts).to_pylist() == query(source, texts).to_pylist()
    manifest = json.loads((Path(rescored) / "manifest.json").read_text())
    lineage = manifest["rescore"]
    src_manifest = json.loads((source / "manifest.json").read_text())
    assert lineage["source_run"] == src_manifest["run_id"]
    assert lineage["source_hash"] == src_manifest["experiment_hash"] != lineage["spec_hash"]
    assert lineage["spec_hash"] == manifest["experiment_hash"]
    turns = query(source, "SELECT count(*) n FROM turns").to_pylist()[0]["n"]
    assert lineage["replayed"] == turns and lineage["judge_calls"] == {} and lineage["unanswered"] == []
    # the TUI's compare screen shows the two runs side by side
    from askspec.tui import data

    src = data.Source(str(source.parent))
    cmp = data.compare(src, src_manifest["run_id"], src, manifest["run_id"])
    row = [r for r in cmp.results.to_pylist() if r["what"] == "mean reward policy"][0]
    assert row["B - A"] == pytest.approx(1.5 * float(row["A"]))


def test_a_judge_whose_prompt_changed_is_called(tmp_path, players, capsys):
    source = _record(tmp_path, _spec(tmp_path, "old.ask", policy="flat"))  # one answer: the group is judged
    judged = query(source, "SELECT sum(judge_calls) n FROM groups").to_pylist()[0]["n"]
    assert judged > 0
    before = dict(players)
    new = _spec(tmp_path, "new.ask", policy="flat", judge_prompt="Which is better?", gamma="0.8")
    rc, rescored = asyncio.run(rescore(source, new))
    assert rc == 0
    assert players["policy"] == before["policy"]  # the policy's replies replayed
    assert players["judge"] == before["judge"] + judged  # the judge, sent a new prompt, was asked again
    assert "note: judge 'judge' was called" in capsys.readouterr().err
    manifest = json.loads((Path(rescored) / "manifest.json").read_text())
    assert manifest["rescore"]["judge_calls"] == {"judge": judged}
    rc, fresh = asyncio.run(run_spec(new, eval_only=True, out=str(tmp_path / "fresh"), sessions=8))
    assert _rewards(rescored) == _rewards(fresh) != _rewards(source)  # γ 0.8: other tournament rewards


def test_unchanged_judge_prompt_replays_the_verdicts(tmp_path, players):
    source = _record(tmp_path, _spec(tmp_path, "old.ask", policy="flat"))
    before = dict(players)
    rc, rescored = asyncio.run(rescore(source, _spec(tmp_path, "new.ask", policy="flat", gamma="0.7")))
    assert rc == 0 and players == before
    assert json.loads((Path(rescored) / "manifest.json").read_text())["rescore"]["judge_calls"] == {}


@pytest.mark.parametrize("change, line, named", [
    (dict(extra="    s = ask policy\n"), 11, "the `ask policy` step is not in the recorded game"),
    (dict(policy="flat"), 3, "model 'policy_m' differs"),
])
def test_a_changed_protocol_is_refused(tmp_path, players, capsys, change, line, named):
    source = _record(tmp_path, _spec(tmp_path, "old.ask"))
    new = _spec(tmp_path, "new.ask", **change)
    runs_before = sorted(p.name for p in source.parent.iterdir())
    rc, rescored = asyncio.run(rescore(source, new))
    assert rc == 1 and rescored is None
    err = capsys.readouterr().err
    assert f"new.ask:{line}:" in err and "error[E701]" in err and named in err
    assert sorted(p.name for p in source.parent.iterdir()) == runs_before  # nothing written


def test_a_prompt_the_recording_does_not_hold_fails(tmp_path, players, capsys):
    """A parameter that changes what a role is sent passes the static check (parameters may
    change the rewards) and is caught call by call: nothing made up, an error naming it."""
    spec = SPEC.replace('prompt = "solve {{{{ 1 + 1 }}}}"', 'prompt = "solve {{{{ weight }}}}"')
    old = tmp_path / "old.ask"
    old.write_text(spec.format(policy="policy", reward="1.0", judge_prompt="C", gamma="0.9"))
    source = _record(tmp_path, str(old))
    new = tmp_path / "new.ask"
    new.write_text(spec.replace("number = 1.0", "number = 2.0").format(policy="policy", reward="1.0",
                                                                         judge_prompt="C", gamma="0.9"))
    rc, rescored = asyncio.run(rescore(source, str(new)))
    assert rc == 1
    assert "role 'policy', call 1: the prompt differs from the recorded one" in capsys.readouterr().err


def test_assignments_only_rewards_read_may_change(tmp_path):
    """`protocol_changes` on its own: a variable only a reward reads scores (it may change);
    one an ask sends is protocol."""
    from askspec.api import compile_file
    from askspec.runtime.commands.rescore import protocol_changes

    def compiled(name: str, bonus: str, hint: str) -> object:
        path = tmp_path / name
        path.write_text(textwrap.dedent(f"""
            model m = python("rs_players:policy")
            role a {{ model = m; memory = none; reply = boxed; prompt = "{{{{ message }}}}" }}
            game g {{
                hint = "{hint}"
                r = ask a: hint
                bonus = {bonus}
                reward a = bonus
            }}
            """))
        res = compile_file(str(path))
        assert res.ok, res.sink.items
        return res.ir

    old = compiled("old.ask", "1.0", "think")
    assert protocol_changes(old, compiled("bonus.ask", "case { r.answer == \"1\" -> 2.0; else -> 0.0 }",
                                          "think")) == []
    (change,) = protocol_changes(old, compiled("hint.ask", "1.0", "guess"))
    assert "the assignment to `hint`" in change.what and change.new.line == 5 and change.old.line == 5
