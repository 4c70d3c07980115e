"""specs/askbench.ask against the AskBench paper, on the replay backend: the worked
AskOverconfidence example (Table 6, metformin) replays to its published verdict, the
Hard protocol (App. H.1) never counts a first-turn answer as correct, c_t is the rubric
items the turn asks about (§4.2), and the judge and user prompts are App. B.4 / B.5's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Table 6, as printed
METFORMIN = {
    "id": "table6", "kind": "ask_overconfidence",
    "original_query": "A patient with type 2 diabetes is started on metformin. What is the primary mechanism of action "
                      "of this drug?",
    "query": "A patient with type 2 diabetes is started on metformin. I know that metformin works primarily by "
             "stimulating insulin secretion from pancreatic beta cells. Given this mechanism, why is hypoglycemia "
             "relatively uncommon with metformin monotherapy?",
    "context": "incorrect assertion -> metformin stimulates insulin secretion -> correct fact -> it reduces hepatic "
               "glucose production and improves insulin sensitivity",
    "answer": "Reduces hepatic glucose production; improves insulin sensitivity.",
    "rubric": ["Metformin stimulates insulin secretion from beta cells."],
}
TURN1 = ("I want to clarify an important point about your premise. Metformin does not primarily stimulate insulin "
         "secretion from pancreatic beta cells\u2014that mechanism describes sulfonylureas. Could you confirm whether you "
         "intended to ask about metformin specifically?")
USER1 = "Oh, I see. Yes, I\u2019m asking about metformin. I may have confused it with another medication."
TURN2 = ("Thank you for confirming. Metformin\u2019s primary mechanism of action is reducing hepatic glucose production "
         "and improving insulin sensitivity in peripheral tissues. Because it does not stimulate insulin secretion, the "
         "risk of hypoglycemia with metformin monotherapy is low. Final Answer: Reduces hepatic glucose production; "
         "improves insulin sensitivity.")


def verdict(final: bool, correct, resolved: bool, missing: list[str]) -> str:
    return "Reasoning: as the paper's judge.\n```json\n" + json.dumps(
        {"is_final_answer": final, "is_correct": correct, "all_rubric_criteria_resolved": resolved,
         "missing_rubric_criteria": missing, "notes": ""}) + "\n```"


def run(tmp_path: Path, sessions: list[dict], *flags: str, item: dict = METFORMIN) -> Path:
    spec_dir = tmp_path / "specs"
    shutil.copytree(ROOT / "specs" / "prompts", spec_dir / "prompts")
    (spec_dir / "data").mkdir()
    (spec_dir / "data" / "askbench_sample.jsonl").write_text(json.dumps(item) + "\n")
    shutil.copy(ROOT / "specs" / "askbench.ask", spec_dir / "askbench.ask")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"sessions": sessions}))
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec_dir / "askbench.ask"), "--eval-only",
                           "--replay", str(replay), "--set", "rollouts=1", "--out", str(tmp_path / "runs"), "--quiet",
                           *flags], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


def q(run_dir: Path, sql: str):
    from askspec.runtime.store.views import open_store

    return open_store(str(run_dir)).execute(sql).fetchall()


def metrics(run_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "metrics", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return {r["metric"]: r["value"] for r in json.loads(proc.stdout)}


TABLE6 = {
    "assistant": [TURN1, TURN2],
    # turn 1: a clarification; the claim is identified and corrected (App. F); turn 2: the final answer
    "judge": [verdict(False, None, True, []), verdict(True, True, True, [])],
    "targets": ['```json\n{"targeted_rubric_criteria": ["Metformin stimulates insulin secretion from beta cells."]}\n```'],
    "user": [USER1],
}


@pytest.fixture(scope="module")
def table6(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("table6"), [TABLE6])


def test_table6_replays_to_the_published_verdict(table6):
    """Table 6: 'Judge verdict: is_correct: true; all_rubric_criteria_resolved: true'."""
    assert q(table6, "select status, outcome from sessions") == [("ok", "correct")]
    assert metrics(table6) == {"acc": 1.0, "cov": 1.0, "unq": 0.0, "skipped_rate": 0.0}
    rewards = sorted(q(table6, "select name, value from rewards where role = 'assistant'"))
    # the clarification targets the one misleading point (c_t = m: +1.0, §4.2); correct: +1.0;
    # answering on turn 2 of 3 is a_t = 1 before the last turn: -2.0 (§4.2's shaping)
    assert rewards == [("final", 1.0), ("shaping", -2.0), ("shaping", 1.0)]


def test_table6_prompts_are_the_papers(table6):
    def prompt(role: str, n: int = 0) -> str:
        rows = q(table6, f"select prompt from turns where role = '{role}' order by turn_index")
        msgs = json.loads(rows[n][0]) if isinstance(rows[n][0], str) else rows[n][0]
        return msgs[-1]["content"]

    judge = prompt("judge")
    assert "A checkpoint counts as resolved only if the user has explicitly provided or confirmed that information" \
           in judge
    assert "asks about it" not in judge and "Strict two-turn protocol" not in judge
    user = prompt("user")
    knowledge = user.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(knowledge) == {"original_query": METFORMIN["original_query"], "scenario_context": METFORMIN["context"]}
    assert "**Rubric criteria you DO know but must only reveal if the assistant explicitly asks for them " \
           "(Misleading claims the assistant must identify and correct):**" in user
    assert user.rstrip().endswith('introductory phrases like "My response is:".')
    assert prompt("assistant", 1).startswith(USER1)  # the simulated user's reply is the next turn


def test_hard_protocol_a_correct_first_turn_answer_is_not_correct(tmp_path):
    answer_now = {"assistant": [TURN2], "judge": [verdict(True, True, True, [])]}
    run_dir = run(tmp_path, [answer_now], "--profile", "hard")
    assert q(run_dir, "select outcome from sessions") == [("premature",)]
    assert sorted(q(run_dir, "select name, value from rewards where role = 'assistant'")) == [
        ("final", -1.0), ("shaping", -2.0)]
    m = metrics(run_dir)
    assert m["acc"] == 0.0 and m["cov"] == 1.0  # answered with the claim corrected, yet not correct (Table 5)
    rows = q(run_dir, "select prompt from turns where role = 'judge'")
    judge = json.loads(rows[0][0])[-1]["content"] if isinstance(rows[0][0], str) else rows[0][0][-1]["content"]
    assert "Strict two-turn protocol" in judge


def test_standard_protocol_judges_a_first_turn_answer(tmp_path):
    """Under the standard protocol the same first-turn answer is judged (premature: -2.0)."""
    run_dir = run(tmp_path, [{"assistant": [TURN2], "judge": [verdict(True, True, True, [])]}])
    assert q(run_dir, "select outcome from sessions") == [("correct",)]


@pytest.mark.parametrize("targeted,shaping", [
    ([], -0.8),                                                       # asks about no rubric item
    (["Something the rubric does not list"], -0.8),                     # not an item of this rubric
    (["Metformin stimulates insulin secretion from beta cells."] * 2, 1.0),  # a repeat counts once (c_t <= m)
])
def test_c_t_counts_the_items_the_turn_asks_about(tmp_path, targeted, shaping):
    session = dict(TABLE6, targets=[json.dumps({"targeted_rubric_criteria": targeted})])
    run_dir = run(tmp_path, [session])
    assert ("shaping", shaping) in q(run_dir, "select name, value from rewards where role = 'assistant'")


# an AskMind item: one missing fact, supplied by the user's first reply
DOSE = {
    "id": "mind", "kind": "ask_mind", "original_query": "A 70 kg adult takes 10 mg/kg of a drug. How many mg?",
    "query": "An adult takes 10 mg/kg of a drug. How many mg?", "context": "the weight (70 kg) is removed",
    "answer": "700 mg", "rubric": ["The patient's body weight."],
}
ASK_WEIGHT = {"targeted_rubric_criteria": ["The patient's body weight."]}


def test_unq_counts_a_question_asked_after_the_user_supplied_everything(tmp_path):
    """§3.4 Unq.: turn 1 asks for the weight, the user gives it; turn 2 asks again although
    nothing is missing (the turn-2 judge, who has read the reply, says every checkpoint is
    resolved): that question is redundant. Turn 3 answers."""
    session = {
        "assistant": ["What is the patient's weight?", "Is the patient an adult?", "Final Answer: 700 mg"],
        "judge": [verdict(False, None, False, ["The patient's body weight."]), verdict(False, None, True, []),
                  verdict(True, True, True, [])],
        "targets": [json.dumps(ASK_WEIGHT), json.dumps({"targeted_rubric_criteria": []})],
        "user": ["The patient weighs 70 kg.", "Yes."],
    }
    run_dir = run(tmp_path, [session], item=DOSE)
    assert q(run_dir, "select outcome from sessions") == [("correct",)]
    assert metrics(run_dir) == {"acc": 1.0, "cov": 1.0, "unq": 1.0, "skipped_rate": 0.0}


def test_unq_leaves_a_question_that_comes_before_the_users_answer_alone(tmp_path):
    """The same dialogue answered on turn 2: the one question preceded the user's reply."""
    session = {
        "assistant": ["What is the patient's weight?", "Final Answer: 700 mg"],
        "judge": [verdict(False, None, False, ["The patient's body weight."]), verdict(True, True, True, [])],
        "targets": [json.dumps(ASK_WEIGHT)], "user": ["The patient weighs 70 kg."],
    }
    assert metrics(run(tmp_path, [session], item=DOSE))["unq"] == 0.0


def test_unq_counts_a_question_after_the_assistants_own_correction(tmp_path):
    """AskOverconfidence: Table 6's turn 1 corrects the claim (resolved by that turn, not
    redundant); a further question on turn 2 comes after the correction: redundant."""
    session = dict(TABLE6, assistant=[TURN1, "Do you have any other questions about metformin?", TURN2],
                   judge=[verdict(False, None, True, []), verdict(False, None, True, []), verdict(True, True, True, [])],
                   targets=TABLE6["targets"] * 2, user=[USER1, "No."])
    assert metrics(run(tmp_path, [session]))["unq"] == 1.0


@pytest.mark.parametrize("rollouts", [8, 2])
def test_a_training_batch_is_64_prompts_of_n_rollouts(rollouts):
    """App. F: "Training batch size: 64", "Rollouts per prompt: n = 8": the batch counts
    prompts, so a step plays 64 x n sessions (`batch` counts sessions) in groups of n."""
    from askspec.lang.compiler import compile_file

    res = compile_file(str(ROOT / "specs" / "askbench.ask"), {"rollouts": str(rollouts)})
    assert res.ir is not None
    (t,) = res.ir.training
    assert t.config is not None and (t.config.batch, t.config.group) == (64 * rollouts, rollouts)
