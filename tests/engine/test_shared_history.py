"""A diversity()/novelty() history shared by the processes that play one phase together
(runtime/engine/stateful.py SharedHistory; an OpenRLHF job's agents, one per vLLM engine
and phase, through launch.sh's $ASKSPEC_HISTORY and $ASKSPEC_LAUNCH): every call scores
against every earlier call of every process, in the order the calls took the file's lock."""

from __future__ import annotations

import json
import subprocess
import sys

from askspec.runtime.engine.stateful import SharedHistory, StatefulScorers

KW = {"history": 100, "tau_sim": 0.3}
TEXTS = ["What is two plus two?", "What is two plus three?", "Name a prime above ten.", "What is two plus two?",
         "Which prime follows eleven?", "How many sides has a square?", "What is two plus three?"]


def test_alternating_processes_score_as_one_history(tmp_path):
    """Two agents taking turns give exactly the scores of one history that saw every call."""
    a, b = SharedHistory(tmp_path / "h.ndjson"), SharedHistory(tmp_path / "h.ndjson")
    one = StatefulScorers()
    for n, text in enumerate(TEXTS):
        agent = (a, b)[n % 2]
        assert agent("novelty", "q", text, KW) == one("novelty", "q", text, KW), (n, text)
    lines = [json.loads(x) for x in (tmp_path / "h.ndjson").read_text().splitlines()]
    assert [t for _, _, t, _, _ in lines] == TEXTS
    # the agent that never asked it scores a repeat as the one history does: not as new
    fresh = StatefulScorers()("novelty", "q", TEXTS[0], KW)
    assert b("novelty", "q", TEXTS[0], KW) == one("novelty", "q", TEXTS[0], KW) < fresh


def test_earlier_phases_from_the_file_or_from_history_json(tmp_path):
    """An earlier phase's calls: from the shared file in a job without buffers between its
    phases; from history.json (session order) in a job with them, the file's lines of
    other launches then left out, so that no call counts twice."""
    from askspec.runtime.targets.openrlhf import adapter

    shared = tmp_path / "runs" / "history" / "h.ndjson"
    # a job without history.json (no buffer between phases): an earlier phase's launch wrote to the file
    earlier = adapter.carried_history(tmp_path, str(shared), "launch-1")
    earlier("novelty", "q", TEXTS[1], KW)
    assert shared.is_file()  # its folder made on the first call
    now = adapter.carried_history(tmp_path, str(shared), "launch-2")
    one = StatefulScorers()
    one.replay("novelty", "q", TEXTS[1], KW)
    assert now("novelty", "q", TEXTS[1], KW) == one("novelty", "q", TEXTS[1], KW) < 1.0  # the earlier phase's call
    # with history.json (a buffer job): the earlier phases' calls come from it, in session order, and the file's
    # lines of other launches are not replayed again
    (tmp_path / "history.json").write_text(json.dumps([["novelty", "q", TEXTS[0], KW]]))
    agent = adapter.carried_history(tmp_path, str(shared), "launch-3")
    assert isinstance(agent, SharedHistory)
    one = StatefulScorers()
    one.replay("novelty", "q", TEXTS[0], KW)
    assert agent("novelty", "q", TEXTS[1], KW) == one("novelty", "q", TEXTS[1], KW)  # launch-1/2's TEXTS[1] left out
    assert not isinstance(adapter.carried_history(tmp_path), SharedHistory)  # no $ASKSPEC_HISTORY: this process's own


def test_a_line_cut_short_is_skipped_and_the_history_goes_on(tmp_path):
    path = tmp_path / "h.ndjson"
    path.write_text(json.dumps(["novelty", "q", TEXTS[0], KW, ""]) + "\n" + '["novelty", "q", "What is')
    agent, one = SharedHistory(path), StatefulScorers()
    one.replay("novelty", "q", TEXTS[0], KW)  # the whole line is read, the cut one skipped
    assert agent("novelty", "q", TEXTS[0], KW) == one("novelty", "q", TEXTS[0], KW)
    assert agent("novelty", "q", TEXTS[2], KW) == one("novelty", "q", TEXTS[2], KW)
    other = SharedHistory(path)  # the cut line did not swallow the next one
    assert other("novelty", "q", TEXTS[2], KW) == one("novelty", "q", TEXTS[2], KW)
    assert [json.loads(x)[2] for x in path.read_text().splitlines()[2:]] == [TEXTS[0], TEXTS[2], TEXTS[2]]


WORKER = """
import json, sys
from askspec.runtime.engine.stateful import SharedHistory
agent = SharedHistory(sys.argv[1])
kw = {"history": 5, "tau_sim": 0.3}
out = [[t, agent("novelty", "q", t, kw)] for t in (f"question {sys.argv[2]} {i % 7} about {i % 3}" for i in range(40))]
print(json.dumps(out))
"""


def test_concurrent_processes_each_score_against_the_file_before_them(tmp_path):
    """Three processes at once: the file holds all their calls, and each call's score is the
    one a single history replaying the file's earlier lines gives (|H| = 5, so order counts)."""
    path = tmp_path / "h.ndjson"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), tag], stdout=subprocess.PIPE, text=True)
             for tag in ("a", "b", "c")]
    got = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 120
    one = StatefulScorers()
    replayed = [[text, one("novelty", "q", text, kw)] for _, _, text, kw, _ in lines]
    for tag, scores in zip("abc", got):
        mine = [r for r in replayed if r[0].startswith(f"question {tag} ")]
        assert mine == scores
