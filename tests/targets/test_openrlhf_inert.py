"""A spec's text reaches the generated job as data, never as code (issue #25): its file
name (the experiment's name when the spec has no `experiment` block), a model's weights
string, a base URL, a data value and the output folder may hold quotes, backslashes, line
breaks, `\\N`, `$(...)`, backticks or template braces, and still every `.py` of the job
compiles, every `.sh` passes `bash -n`, importing the agent (OpenRLHF's own loader) and
running the scripts (ray, vllm and curl stubbed) runs none of it — the payload would
create a file named PWNED — and the stubs receive the weights exactly as written."""

from __future__ import annotations

import ast
import json
import os
import py_compile
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from askspec.lang.compiler import compile_file
from askspec.runtime.targets.openrlhf import escape
from askspec.runtime.targets.openrlhf.generate import compile_job
from askspec.runtime.targets.openrlhf.mapping import hf_id

from openrlhf_harness import launch_argv, load_agent_executor, train_flags

MARKER = "PWNED"

# one frozen hf model (serve_frozen.sh), one openai model (job.json, README); every
# hostile value is a {placeholder} filled with an askspec string literal
SINGLE = """
model m = hf({trained}) {{ max_tokens = 32 }}
model f = hf({frozen})
model g = openai({remote}, base_url = {url})
role p {{ model = m; trained }}
role q {{ model = f }}
role r {{ model = g }}
game a for x in [{value}, "plain"] sample 2 {{
    s = ask p using "Say {{{{ x }}}}."
    t = ask q: s.text
    u = ask r: t.text
    reward p = 1.0
}}
train p with rloo {{ lr = 0.000001; batch = 4 }}
"""

# two trained roles: driver.sh, and a trained role served frozen from its checkpoint
ALTERNATING = """
model m = hf({trained}) {{ max_tokens = 32 }}
model f = hf({frozen})
role p {{ model = m; trained }}
role s {{ model = f; trained }}
game a for x in [{value}, "plain"] sample 2 {{
    t = ask p using "Say {{{{ x }}}}."
    u = ask s: t.text
    reward p = 1.0
    drop s
}}
game b for x in [{value}, "plain"] sample 2 {{
    u = ask s using "Say {{{{ x }}}}."
    reward s = 1.0
}}
train p with rloo {{ lr = 0.000001; batch = 4 }}
train s with rloo {{ lr = 0.000001; batch = 4 }}
schedule alternating {{ p = 1; s = 1; iterations = 1; games = {{p: a, s: b}} }}
"""

_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """`text` as an askspec string literal."""
    return '"' + "".join(_LITERAL_ESCAPES.get(c, c) for c in text) + '"'


def compile_hostile(root: Path, layout: str, name: str, values: dict[str, str], out_name: str = "job") -> Path:
    spec = root / f"{name}.ask"
    spec.write_text(layout.format(**{k: literal(v) for k, v in values.items()}), encoding="utf-8")
    res = compile_file(str(spec), {})
    assert res.ok, [d.message for d in res.sink.items]
    out = root / out_name
    assert compile_job(res, str(spec), str(out), {}) == 0
    return out


def planted(root: Path) -> list[Path]:
    return [p for p in root.rglob(MARKER) if p.name == MARKER]


def assert_inert(root: Path, job: Path, weights: dict[str, str], spec_name: str, monkeypatch) -> None:
    """Compile, import and run everything the job holds; nothing of a payload runs."""
    for py in job.rglob("*.py"):
        if "spec" not in py.relative_to(job).parts:
            py_compile.compile(str(py), doraise=True, cfile=str(root / "pyc"))
    scripts = [sh for sh in job.rglob("*.sh")]
    for sh in scripts:
        subprocess.run(["bash", "-n", str(sh)], check=True, capture_output=True, timeout=30)
    monkeypatch.chdir(root)  # a relative payload would land here
    for agent in job.rglob("agent.py"):
        load_agent_executor(agent)
    calls = []
    if (job / "driver.sh").exists():
        calls += launch_argv(job / "driver.sh", root)
    else:
        calls += launch_argv(job / "serve_frozen.sh", root)
        calls += launch_argv(job / "launch.sh", root)
    if (job / "serve_frozen.sh").exists():
        subprocess.run(["bash", str(job / "serve_frozen.sh"), "stop"], check=True, capture_output=True, timeout=30)
    assert planted(root) == []
    # the data arrived as data: each program got the weights exactly as the spec wrote them
    served = [c[2] for c in calls if c[:2] == ["vllm", "serve"]]
    pretrain = [f[f.index("--actor.model_name_or_path") + 1] for f in (train_flags(c) for c in calls if c[0] == "ray")]
    assert hf_id(weights["frozen"]) in served
    assert pretrain[0] == hf_id(weights["trained"])
    # Ray's runtime environment is valid JSON naming the job's folder, whatever its name
    for call in (c for c in calls if c[0] == "ray"):
        (env,) = [a.split("=", 1)[1] for a in call if a.startswith("--runtime-env-json=")]
        folder = Path(json.loads(env)["working_dir"])
        assert folder == job or folder.parent == job
    # the README's command line, pasted into a shell, names the spec file
    with open(job / "README.md", encoding="utf-8", newline="") as f:  # a "\r" in the name stays one
        readme = f.read()
    lexer = shlex.shlex(readme[readme.index("`askspec compile ") + len("`askspec compile "):], posix=True)
    lexer.whitespace_split = True
    assert lexer.get_token() == spec_name


# ------------------------------------------------------------------ the reported cases
DOCSTRING_BREAK = 'x"""; open("PWNED", "w"); """'


def test_file_name_cannot_close_the_agent_docstring(tmp_path, monkeypatch) -> None:
    job = compile_hostile(tmp_path, SINGLE, DOCSTRING_BREAK, dict(
        trained="smollm2-135m-instruct", frozen="org/frozen", remote="judge", url="http://h:1/v1", value="v"))
    monkeypatch.chdir(tmp_path)
    load_agent_executor(job / "agent.py")
    assert planted(tmp_path) == []
    doc = ast.get_docstring(ast.parse((job / "agent.py").read_text(encoding="utf-8")))
    assert doc is not None and f"experiment '{DOCSTRING_BREAK}'" in doc  # shown, as written


def test_backslash_n_in_the_name_keeps_the_agent_valid(tmp_path) -> None:
    job = compile_hostile(tmp_path, SINGLE, "bad\\N", dict(
        trained="smollm2-135m-instruct", frozen="org/frozen", remote="judge", url="http://h:1/v1", value="v"))
    py_compile.compile(str(job / "agent.py"), doraise=True, cfile=str(tmp_path / "pyc"))
    doc = ast.get_docstring(ast.parse((job / "agent.py").read_text(encoding="utf-8")))
    assert doc is not None and "experiment 'bad\\N'" in doc


@pytest.mark.parametrize("field", ["frozen", "name"])
def test_line_break_cannot_leave_a_shell_comment(tmp_path, monkeypatch, field) -> None:
    """A frozen model's weights (serve_frozen.sh's `# weights ...`) or the file name
    (launch.sh's and serve_frozen.sh's headers) with a newline."""
    payload = "x\ntouch PWNED\n#"
    values = dict(trained="smollm2-135m-instruct", frozen=payload if field == "frozen" else "org/frozen",
                  remote="judge", url="http://h:1/v1", value="v")
    name = payload if field == "name" else "spec"
    job = compile_hostile(tmp_path, SINGLE, name, values)
    assert_inert(tmp_path, job, values, f"{name}.ask", monkeypatch)


def test_a_nul_in_the_weights_is_refused_and_nothing_is_written(tmp_path, capsys) -> None:
    spec = tmp_path / "nul.ask"
    spec.write_text(SINGLE.format(trained='"smollm2-135m-instruct"', frozen='"a\\0b"', remote='"j"',
                                  url='"http://h:1/v1"', value='"v"'), encoding="utf-8")
    res = compile_file(str(spec), {})
    assert res.ok
    assert compile_job(res, str(spec), str(tmp_path / "job"), {}) == 1
    assert "NUL character" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("field", ["trained", "frozen"])
def test_a_leading_dash_in_the_weights_is_refused(tmp_path, capsys, field) -> None:
    values = {"trained": '"smollm2-135m-instruct"', "frozen": '"org/f"', "remote": '"j"', "url": '"http://h:1/v1"',
              "value": '"v"', field: '"--trust-remote-code"'}
    spec = tmp_path / "dash.ask"
    spec.write_text(SINGLE.format(**values), encoding="utf-8")
    res = compile_file(str(spec), {})
    assert res.ok
    assert compile_job(res, str(spec), str(tmp_path / "job"), {}) == 1
    assert "weights --trust-remote-code start with '-'" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


def test_empty_weights_are_refused(tmp_path, capsys) -> None:
    """`hf("")` named no model: the job ran `vllm serve ""`; its scripts now refuse an empty
    PRETRAIN, so the compile says so instead."""
    spec = tmp_path / "empty.ask"
    spec.write_text(SINGLE.format(trained='""', frozen='"org/f"', remote='"j"', url='"http://h:1/v1"', value='"v"'))
    res = compile_file(str(spec), {})
    assert res.ok
    assert compile_job(res, str(spec), str(tmp_path / "job"), {}) == 1
    assert "model 'm': empty weights" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


def test_a_template_cannot_emit_an_unescaped_value() -> None:
    """The job environment is fail-closed: a `{{ value }}` without an escape.py filter
    fails the render instead of writing the value as code."""
    from askspec.runtime.targets.openrlhf.generate import _environment

    env = _environment()
    with pytest.raises(TypeError, match="unescaped str"):
        env.from_string("# {{ name }}").render(name="x\ntouch PWNED")
    assert env.from_string("# {{ name | line }} {{ n }}").render(name="x\ntouch PWNED", n=3) == "# x\\ntouch PWNED 3"
    with pytest.raises(ValueError, match="not an identifier"):
        escape.sh_name("a$(b)")


# --------------------------------------------------------------------- property test
PIECES = ['"""', "'''", "'", '"', "\\", "\\\\", "\n", "\r", "\r\n", "\\N", "\\N{BULLET}", "\\x", "\\u00", "$(touch PWNED)",
          "`touch PWNED`", "\ntouch PWNED\n", ";touch PWNED;", "&& touch PWNED", "| touch PWNED", "{", "}", "{{ x }}",
          "{% if 1 %}", "%}", "#", "${HOME}", "$PATH", "%s", "é", "名前", "\u2028", "\x85", "\x1b[2J", "\t", " ",
          '__import__("os").system("touch PWNED")', '""";open("PWNED","w");"""', "-", "--x", "~", "*", "?", "!"]
hostile = st.lists(st.sampled_from(PIECES) | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
                                                   max_size=3), min_size=1, max_size=6).map("".join)
# weights: a leading "-" is refused (an option to vllm serve), test_a_leading_dash_... below; so
# are empty weights (test_empty_weights_are_refused)
weights = hostile.filter(lambda s: s != "" and not s.startswith("-"))
# a file name: no "/" or NUL, at most 255 bytes with ".ask"
file_names = hostile.map(lambda s: s.replace("/", "_")).filter(lambda s: len(s.encode("utf-8")) <= 200)


# bounded: ~1 s an example; no shrinking (PIECES keep a failing example readable, and
# shrinking a job compile takes minutes)
@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=file_names, out=file_names, trained=weights, frozen=weights, remote=hostile, url=hostile, value=hostile,
       alternating=st.booleans())
@example(name='x"""; open("PWNED", "w"); """', out="o", trained="t", frozen="x\ntouch PWNED\n#", remote="r",
         url="u", value="v", alternating=False)
@example(name="bad\\N", out="$(touch PWNED)", trained="a'b\n$(touch PWNED)", frozen="`touch PWNED`", remote="r",
         url="u", value="v", alternating=True)
def test_hostile_text_stays_data(monkeypatch, name, out, trained, frozen, remote, url, value, alternating) -> None:
    values = dict(trained=trained, frozen=frozen, remote=remote, url=url, value=value)
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as m:
        root = Path(tmp)
        if alternating:
            values = dict(trained=trained, frozen=frozen, value=value)
        job = compile_hostile(root, ALTERNATING if alternating else SINGLE, name, values, out_name=out + "-job")
        m.setenv("ASKSPEC_RUNS", os.path.join(tmp, "runs"))
        assert_inert(root, job, values, f"{name}.ask", m)


def test_a_file_name_that_is_not_utf8_is_refused(tmp_path, capsys) -> None:
    spec = tmp_path / os.fsdecode(b"sur\xffx.ask")  # the undecodable byte arrives as "\udcff"
    spec.write_text(SINGLE.format(trained='"smollm2-135m-instruct"', frozen='"org/f"', remote='"j"',
                                  url='"http://h:1/v1"', value='"v"'), encoding="utf-8")
    res = compile_file(str(spec), {})
    assert res.ok
    assert compile_job(res, str(spec), str(tmp_path / "job"), {}) == 1
    assert "sur\\udcffx.ask is not valid UTF-8: rename the file" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


def test_data_that_is_not_utf8_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "d.jsonl").write_text('{"q": "a\\udcffb"}\n', encoding="utf-8")  # JSON's escape for a lone surrogate
    spec = tmp_path / "s.ask"
    spec.write_text(SINGLE.replace('game a for x in [{value}, "plain"]', 'data d = jsonl("d.jsonl") {{ fields = {{q: string}} }}\n'
                                   'game a for x in d').format(trained='"smollm2-135m-instruct"', frozen='"org/f"',
                                                              remote='"j"', url='"http://h:1/v1"'), encoding="utf-8")
    res = compile_file(str(spec), {})
    assert res.ok, [d.message for d in res.sink.items]
    assert compile_job(res, str(spec), str(tmp_path / "job"), {}) == 1
    assert "hold '\\udcff', which is not valid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()
