"""Ask-E App. D (Gemini 3.1 Pro vs the pair mistral-3-3b / qwen3_5-27b) replays through
specs/ask_e.ask (benchmark profile: 4 probes + 1 final) to the published outcome: the
final question is calibrated (mistral 2397, qwen 2911, answer key 2911)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "ask_e.ask"


def turn(reasoning: str, draft: str, question: str) -> str:
    return f"#Reasoning#\n\n{reasoning}\n\n#Draft#\n\n{draft}\n\n#Question#\n\n{question}"


Q1 = "Find the remainder when 2023^{2023} is divided by 100."
Q2 = ("A sequence is defined by $a_1 = 1$, $a_2 = 2$, and $a_{n+1} = (a_n^2 + 1)/a_{n-1}$ for $n \\geq 2$. "
      "Find the value of a_{10} .")
Q3 = ("Find the number of sequences of length 8 formed by the letters A, B, and C such that the sequence does not "
      "contain the consecutive substring \"AB\".")
Q4 = "A fair standard 6-sided die is rolled repeatedly. What is the expected number of rolls needed to obtain two consecutive 6s?"
QF = ("Find the number of sequences of length 6 formed by the letters A, B, C, and D such that the sequence does not "
      "contain the consecutive substring \"AB\".")

QUESTIONER = [  # App. D's questioner outputs (reasoning abridged, questions verbatim)
    turn("I'll start with a standard modular exponentiation problem to gauge their capabilities in number theory.",
         Q1 + "\n\nSolution: ... so $23^{23} \\equiv 23^3 \\equiv 67 \\pmod{100}$.\n\\boxed{67}", Q1),
    turn("Both models successfully solved the modular exponentiation problem ...",
         "... Iterating: $a_6=89$, $a_7=233$, $a_8=610$, $a_9=1597$, $a_{10}=4181$.\n\n\\boxed{4181}", Q2),
    turn("Both models handled the sequence problem correctly ...", "... $S_8=2584$.\n\n\\boxed{2584}", Q3),
    turn("Model 2 perfectly recognized the recurrence relation and correctly computed the values, while Model 1 failed",
         "... Solving gives $E_0 = 42$.\n\n$\\boxed{42}$", Q4),
    turn("In Round 3, Model 1 failed on a combinatorics problem involving strings that avoid a specific consecutive "
         "substring ... To exploit this gap, I will give a similar combinatorics string-avoidance problem",
         "... $S_6=2911$. Verified independently by inclusion-exclusion: $4096 - 1280 + 96 - 1 = 2911$.\n\n\\boxed{2911}",
         QF),
]
MISTRAL = [  # boundary_a: mistral-3-3b's summaries (abridged), the boxed answers as printed
    "#Summary#\nLeveraging Euler's theorem ... yielded the final solution, 67.\n\n\\boxed{67}",
    "#Summary#\nFinally, a_{10} was computed exactly as 4181 by careful division.\n\n\\boxed{4181}",
    "#Summary#\n`\\boxed{1393}`\n\nThis problem was solved using dynamic programming ... yielding the final answer of "
    "1,393 valid sequences.",
    "#Summary#\nBy solving the system of equations, we found the expected number of rolls ... to be 42.\n\n\\boxed{42}",
    "#Summary#\n$\\boxed{2397}$",
]
QWEN = [  # boundary_b: qwen3_5-27b
    "#Summary#\nFinally, computing $23^3 = 12167$ gave a remainder of 67.\n\n\\boxed{67}",
    "#Summary#\n... which confirms the result is 4181.\n\n`\\boxed{4181}`",
    "#Summary#\nThe sequence of counts is 3, 8, 21, 55, 144, 377, 987, 2584.\n\n$\\boxed{2584}$",
    "#Summary#\nSolving the system ... yielded $E = 42$.\n\n\\boxed{42}",
    "#Summary#\n$\\boxed{2911}$",
]
KEY = ["To find the number of valid sequences of length 6, we can set up a recurrence relation. ...\n\n"
       "$$S_n = 3 S_{n-1} + (S_{n-1} - S_{n-2}) = 4 S_{n-1} - S_{n-2}$$\n\n"
       "- $S_5 = 4(209) - 56 = 836 - 56 = 780$\n- $S_6 = 4(780) - 209 = 3120 - 209 = 2911$\n\n$\\boxed{2911}$"]


def test_app_d_final_question_is_calibrated(tmp_path):
    replay = tmp_path / "app_d.json"
    replay.write_text(json.dumps({"sessions": [
        {"questioner": QUESTIONER, "boundary_a": MISTRAL, "boundary_b": QWEN, "answer_key": KEY}]}))
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(SPEC), "--profile", "benchmark", "--eval-only",
                           "--replay", str(replay), "--sessions", "1", "--out", str(tmp_path / "runs"), "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    from askspec.runtime.store.views import open_store

    con = open_store(proc.stdout.strip().splitlines()[-1])
    assert con.execute("select status, outcome from sessions").fetchall() == [("ok", "calibrated")]
    rewards = dict(con.execute("select name, value from rewards where role = 'questioner'").fetchall())
    assert rewards["calibration"] == 1.0  # every turn tagged: no format penalty (§5.1)
    # 4 probing rounds + the final (§4.1), then both boundary models and the key on the final question
    calls = dict(con.execute("select role, count(*) from turns group by role").fetchall())
    assert calls == {"questioner": 5, "boundary_a": 5, "boundary_b": 5, "answer_key": 1}
    prompts = [json.loads(p) if isinstance(p, str) else p for (p,) in con.execute(
        "select prompt from turns where role = 'boundary_a' order by turn_index").fetchall()]
    assert [p[-1]["content"].split("\n\nWhen you are done")[0] for p in prompts] == [Q1, Q2, Q3, Q4, QF]
    # the questioner saw round 4's summaries, and App. D's round-3 gap (1393 vs 2584)
    final_prompt = json.loads(con.execute("select prompt from turns where role = 'questioner' order by turn_index "
                                          "desc limit 1").fetchone()[0])
    assert "\\boxed{1393}" in json.dumps(final_prompt) and "This was your last probing round." in final_prompt[-1]["content"]
