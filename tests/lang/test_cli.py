"""The command line as a user meets it: exit codes, diagnostic format, no tracebacks."""

from __future__ import annotations

import re
import shutil
from pathlib import Path


from lang_helpers import ROOT, SPECS, run_cli

DIAG = re.compile(r"^(?P<path>[^\s:]+):(?P<line>\d+):(?P<col>\d+): error\[(?P<code>E\d{3})\]: (?P<msg>.+)$")


def test_check_all_specs_clean() -> None:
    res = run_cli("check", *[str(p.relative_to(ROOT)) for p in SPECS])
    assert res.returncode == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1] == f"ok: {len(SPECS)} specs checked"
    assert "warning" not in res.stderr  # no warnings either
    # per spec: its "sessions planned" line and its bounds (`askspec estimate`'s summary)
    assert len(lines) == 2 * len(SPECS) + 1
    assert sum("model calls" in line for line in lines) == len(SPECS)
    # a spec that trains: one pass over its games (what --eval-only plays), then each train block's plan
    assert "specs/ask_e.ask: 30 sessions planned (one pass, as --eval-only plays it); train questioner: 200 steps × " \
           "260 sessions" in lines
    assert "; train proposer: 600 steps × 1 session; train solver: 300 steps × 12 sessions" in res.stderr
    assert res.stdout == ""


def test_broken_spec_reports_location_source_and_caret(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ask"
    bad.write_text('model m = hf("smollm2-135m-instruct")\nrole q { model = m; prompt = "Hi" }\n'
                   "game g {\n    ask q\n    ask questionr\n}\n")
    res = run_cli("check", "bad.ask", cwd=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    m = DIAG.match(lines[0])
    assert m, lines[0]
    assert (m["path"], m["line"], m["col"], m["code"]) == ("bad.ask", "5", "9", "E102")
    assert lines[1] == " 5 |     ask questionr"
    assert lines[2] == "   |         ^^^^^^^^^"
    assert "Traceback" not in res.stderr + res.stdout


NASTY = {
    "empty.ask": b"",
    "binary.ask": bytes(range(256)),
    "bad_utf8.ask": b'param x = "\xff\xfe"\n',
    "nul.ask": b"param x = 1\x00\n",
    "deep.ask": b"param x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n",
    "deep_blocks.ask": b"game g {\n" + b"if true {\n" * 3000 + b"}\n" * 3001,
    "unclosed.ask": b"role r {\n  model = m\n",
    "keyword_soup.ask": b"game game game { ask ask ask }\n",
    "huge.ask": b"# " + b"x" * (2 * 1024 * 1024) + b"\n",
}


def test_no_traceback_on_nasty_input(tmp_path: Path) -> None:
    for name, data in NASTY.items():
        (tmp_path / name).write_bytes(data)
    names = sorted(NASTY)
    runs = [("check", *names), ("fmt", "--check", *names)]
    runs += [("compile", name, "--format", "text") for name in names]
    for cmd in runs:
        res = run_cli(*cmd, cwd=tmp_path)
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out[-2000:]
        assert "E999" not in out, out[-2000:]
        assert res.returncode in (0, 1), (cmd, res.returncode, out[-500:])


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for target in ("missing.ask", "."):
        res = run_cli("check", target, cwd=tmp_path)
        assert res.returncode == 1
        assert "error[E004]" in res.stderr and "Traceback" not in res.stderr


def test_set_override_type_checks() -> None:
    ok = run_cli("check", "specs/ask_e.ask", "--set", "probes=2")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("check", "specs/ask_e.ask", "--set", 'probes="x"')
    assert bad.returncode == 1
    assert re.search(r"^specs/ask_e\.ask:\d+:\d+: error\[E111\]: --set probes=\"x\"", bad.stderr, re.M), bad.stderr
    unknown = run_cli("check", "specs/ask_e.ask", "--set", "nope=1")
    assert unknown.returncode == 1 and "error[E111]" in unknown.stderr
    typo = run_cli("check", "specs/ask_e.ask", "--set", "probs=1")
    assert typo.returncode == 1 and "did you mean 'probes'?" in typo.stderr


def test_check_reports_the_planned_session_count(tmp_path: Path) -> None:
    """Counted arithmetically: a plan of 10**12 sessions is reported at once, with W503."""
    (tmp_path / "big.ask").write_text('model m = hf("smollm2-135m-instruct")\nrole q { model = m; prompt = "Hi" }\n'
                                      "game g for (a, b) in pairs(range(1, 100000)) times 100 {\n    ask q\n}\n")
    res = run_cli("check", "big.ask", cwd=tmp_path, timeout=30)
    assert res.returncode == 0, res.stderr  # a warning, not an error
    assert "warning[W503]: game 'g' brings the plan to 499,985,000,100 sessions" in res.stderr
    assert "big.ask: 499,985,000,100 sessions planned" in res.stderr
    quiet = run_cli("check", "-q", "big.ask", cwd=tmp_path, timeout=30)
    assert "sessions planned" not in quiet.stderr


def test_version_and_did_you_mean_for_commands() -> None:
    version = run_cli("--version")
    assert version.returncode == 0 and re.fullmatch(r"askspec \d+\.\d+\.\d+\n", version.stdout)
    typo = run_cli("chek", "specs/ask_e.ask")
    assert typo.returncode == 1
    assert "invalid choice: 'chek'" in typo.stderr and "did you mean 'check'?" in typo.stderr
    assert "Traceback" not in typo.stderr
    bad_choice = run_cli("compile", "specs/ask_e.ask", "--format", "jsn")
    assert bad_choice.returncode == 1 and "did you mean 'json'?" in bad_choice.stderr
    bad_flag = run_cli("run", "specs/ask_e.ask", "--sesions", "2")
    assert bad_flag.returncode == 1 and "did you mean '--sessions'?" in bad_flag.stderr


def test_os_errors_are_one_sentence_naming_the_path(tmp_path: Path) -> None:
    res = run_cli("metrics", str(tmp_path / "no-such-run"))
    assert res.returncode == 1
    assert str(tmp_path / "no-such-run") in res.stderr
    assert "[Errno" not in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_fmt_check_exit_codes(tmp_path: Path) -> None:
    shutil.copy(ROOT / "specs" / "ask_e.ask", tmp_path / "clean.ask")
    assert run_cli("fmt", "--check", "clean.ask", cwd=tmp_path).returncode == 0
    messy = tmp_path / "messy.ask"
    messy.write_text("model   m=hf( \"x\" ){temperature=1.0}\n")
    before = messy.read_text()
    res = run_cli("fmt", "--check", "messy.ask", cwd=tmp_path)
    assert res.returncode == 1 and "would reformat messy.ask" in res.stderr
    assert messy.read_text() == before  # --check never writes
    assert run_cli("fmt", "messy.ask", cwd=tmp_path).returncode == 0
    assert messy.read_text() == 'model m = hf("x") { temperature = 1.0 }\n'
    assert run_cli("fmt", "--check", "messy.ask", cwd=tmp_path).returncode == 0
    broken = tmp_path / "broken.ask"
    broken.write_text("role r {\n")
    res = run_cli("fmt", "--check", "broken.ask", cwd=tmp_path)
    assert res.returncode == 1 and "error[E002]" in res.stderr
