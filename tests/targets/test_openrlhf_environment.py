"""The environment values of every generated script are data (issue 33): each script checks
every variable it reads from the environment before any arithmetic or command uses it, and
a bad value stops it with one line naming the variable and exit code 2, before anything is
run or submitted. The variables are found by scanning the generated scripts, so a script
that starts reading a new one is covered (and fails `test_every_variable_read_is_checked`
until it checks it). Also: the driver's iterations and closing line, serve_frozen.sh's pid
file and a server that dies before it is ready."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from askspec.cli import main

from openrlhf_harness import launch_argv

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
# the jobs whose scripts are scanned and run: stages of every kind (sft, evaluate, retrain with
# the inner loop's promotions), an alternating schedule with buffers, a nested schedule, one role
JOBS = {"pasodoble": ROOT / "specs" / "pasodoble.ask", "soar": ROOT / "specs" / "soar.ask",
        "askbench": ROOT / "specs" / "askbench.ask"}
# programs a script may reach once its checks pass: each stand-in records its call and fails
# (askspec's: so that retrain.sh stops before it copies anything), but curl and python
STANDINS = ("ray", "deepspeed", "python", "python3", "vllm", "curl", "askspec")
# set by bash itself, not read from the caller's environment
BASH_OWN = {"PWD", "OLDPWD", "HOME", "PATH", "IFS", "BASH_REMATCH", "RANDOM", "LINENO", "SECONDS", "BASHPID",
            "UID", "EUID", "PPID", "HOSTNAME", "OPTARG", "OPTIND"}
KINDS = ("count", "count_or_empty", "path", "host", "address", "command", "gpus")


# ------------------------------------------------------------------------------- scanning
def _body(text: str) -> list[str]:
    """The script's lines without comments and function definitions (their locals)."""
    out, in_function = [], False
    for line in text.splitlines():
        if in_function:
            in_function = line != "}"
            continue
        if re.match(r"^\w+\(\) \{", line):
            in_function = not line.rstrip().endswith("}")
            continue
        if line.lstrip().startswith("#"):
            continue
        out.append(re.sub(r"\s#\s.*$", "", line))
    return out


_REF = re.compile(r"\$\{[#!]?([A-Za-z_]\w*)|\$([A-Za-z_]\w*)")
_SUBSCRIPT = re.compile(r"\$\{[#!]?[A-Za-z_]\w*\[([A-Za-z_]\w*)\]")  # arithmetic: a bare name is read
_ASSIGN = re.compile(r"(?:^|[\s;&|(])(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)\+?=")
_LOOP = re.compile(r"\bfor\s+(?:\(\(\s*)?([A-Za-z_]\w*)")
_READ = re.compile(r"\bread\s+((?:-\w+\s+)*)([A-Za-z_]\w*(?:\s+[A-Za-z_]\w*)*)")
_ARITH = re.compile(r"\(\((.*?)\)\)")


def env_reads(text: str) -> set[str]:
    """The variables a script reads before it assigns them: from its caller's environment."""
    assigned: set[str] = set()
    reads: set[str] = set()
    for line in _body(text):
        assigned |= set(_LOOP.findall(line))  # a loop's variable is assigned before its bounds are read
        names = {a or b for a, b in _REF.findall(line)} | set(_SUBSCRIPT.findall(line))
        for expr in _ARITH.findall(line):
            names |= set(re.findall(r"(?<![\w$#])([A-Za-z_]\w*)", re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)))
        reads |= {n for n in names if n not in assigned and n not in BASH_OWN}
        assigned |= set(_ASSIGN.findall(line))
        for _, listed in _READ.findall(line):
            assigned |= set(listed.split())
    return reads


def env_checks(text: str) -> dict[str, str]:
    """name -> kind of every `env_check KIND NAME...` line."""
    out = {}
    for kind, names in re.findall(r"^env_check (\w+) (.+)$", text, re.M):
        for name in names.split():
            out[name] = kind
    return out


def required(text: str) -> set[str]:
    """Variables a script refuses to run without (retrain.sh's SAVE_PATH: driver.sh sets it)."""
    return set(re.findall(r'if \[ -z "\$\{(\w+)\+x\}" \]', text))


# --------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, spec in JOBS.items():
        job = tmp_path_factory.mktemp(name) / "job"
        assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
        out[name] = job
    return out


def scripts_of(jobs: dict[str, Path]) -> list[Path]:
    return sorted(sh for job in jobs.values() for sh in job.rglob("*.sh") if "spec" not in sh.parts)


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Path:
    bindir = tmp_path_factory.mktemp("standins")
    for name in STANDINS:  # curl: the servers answer at once (serve_frozen.sh polls every 2 s); python: "{}"
        (bindir / name).write_text('#!/bin/sh\nprintf "%s\\n" "$(basename "$0") $*" >> "$STANDIN_LOG"\n' + (
            "exit 0\n" if name == "curl" else "echo '{}'\n" if name.startswith("python") else "exit 1\n"))
        (bindir / name).chmod(0o755)
    return bindir


def run(script: Path, standins: Path, scratch: Path, env: dict[str, str], *args: str,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """`bash script` with the stand-ins first on PATH and only `env` beyond a plain
    environment (the variables the script needs set: retrain.sh's, which driver.sh sets)."""
    base = {"PATH": f"{standins}:/usr/bin:/bin", "HOME": str(scratch), "LANG": "C.UTF-8",
            "STANDIN_LOG": str(scratch / "standins.log"), "SAVE_PATH": str(scratch / "save"),
            "ASKSPEC_INNER_STATE": str(scratch / "inner")}
    return subprocess.run(["bash", str(script), *args], env={**base, **env}, cwd=scratch, capture_output=True,
                          text=True, timeout=timeout)


# -------------------------------------------------------------------------------- hostile values
def payloads(marker: Path) -> list[str]:
    """Values that would run `touch MARKER` if a script evaluated them."""
    return [f"$(touch {marker})", f"`touch {marker}`", f"PWD[$(touch {marker})]", f"a[$(touch {marker})]+1",
            f"é$(touch {marker})", f"1;touch {marker}"]

UNIVERSAL = ["", "-1", "--help", "-", " "]
BY_KIND = {
    "count": ["0", "08", "010", "10#8", "+3", " 3", "3\n", "1e3", "٣", "３", "2-1", "9999999999", "ACTOR_GPUS"],
    "count_or_empty": ["0", "08", "10#8", "٣", "-2", "x"],
    "host": ["a b", "h;x", "h/x", "h@x", "é", "h\n"],
    "address": ["a b", "http://x/$(y)", "é", "h;x"],
    "command": ["é", "a;b", "a|b", "a*", "a\tb", "'a'"],
    "gpus": ["07", "6,7", "1 x", "-1", "٣", "6\n7", "GPU-", "1.5"],
    "path": [],
}


def valid(kind: str, value: str) -> bool:
    """The checks' rules (docs/cluster.md, "Environment variables"), as a reference."""
    count = re.compile(r"[1-9][0-9]{0,8}", re.ASCII)
    if kind == "count":
        return bool(count.fullmatch(value))
    if kind == "count_or_empty":
        return value == "" or bool(count.fullmatch(value))
    if kind == "path":
        return value != "" and not value.startswith("-")
    if kind == "host":
        return bool(re.fullmatch(r"[A-Za-z0-9.:\[\]-]+", value)) and not value.startswith("-")
    if kind == "address":
        return bool(re.fullmatch(r"[A-Za-z0-9.:/_@\[\]-]+", value)) and not value.startswith("-")
    if kind == "command":
        return bool(re.fullmatch(r"[A-Za-z0-9._/+=:@,][A-Za-z0-9._/+=:@, -]*", value)) and not value.startswith("-")
    if kind == "gpus":
        words = value.split(" ")
        return bool(re.fullmatch(r"[A-Za-z0-9 -]+", value)) and any(words) and all(
            re.fullmatch(r"0|[1-9][0-9]{0,8}|(GPU|MIG)-[A-Za-z0-9-]+", w) for w in words if w)
    raise AssertionError(kind)


def assert_refused_or_inert(script: Path, name: str, kind: str, value: str, standins: Path, scratch: Path,
                            marker: Path) -> None:
    """A value the checks refuse stops the script with one line naming the variable, exit 2,
    and nothing run; one they accept (a path: any word not starting with "-") runs nothing
    of what it holds."""
    # a log of its own: a server an earlier run left in the background may still write to its log
    log = scratch / f"standins-{uuid.uuid4().hex}.log"
    done = run(script, standins, scratch, {name: value, "STANDIN_LOG": str(log)})
    where = f"{script.relative_to(script.parents[1])}: {name}={value!r}"
    assert not marker.exists() and not list(scratch.rglob("PWNED")), f"{where} ran the payload"
    assert not list(script.parents[1].rglob("PWNED")), f"{where} ran the payload"
    if valid(kind, value):
        assert f" {name} must be " not in done.stderr, (where, done.stderr)
        return
    assert done.returncode == 2, (where, done.returncode, done.stderr)
    assert not log.exists(), (where, log.read_text())
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and f"{script.name}: {name} must be " in lines[0], (where, done.stderr)


# ------------------------------------------------------------------------------------- tests
def test_every_variable_read_is_checked(jobs) -> None:
    """Every variable a generated script reads from its environment goes through env_check
    (or is one bash sets itself), and every checked one has a known kind."""
    scripts = scripts_of(jobs)
    assert len(scripts) > 20
    seen: set[str] = set()
    for sh in scripts:
        text = sh.read_text()
        reads, checks = env_reads(text), env_checks(text)
        assert reads, sh
        assert reads <= set(checks), (sh, sorted(reads - set(checks)))
        assert set(checks.values()) <= set(KINDS), sh
        seen |= reads
    # the scan finds what the issue names (and the scripts' paths and hosts)
    assert {"ACTOR_NODES", "ACTOR_GPUS", "SFT_GPUS", "MICRO_BATCH", "ITERATIONS", "FROZEN_GPUS", "PRETRAIN",
            "CKPT_SOLVER", "PRETRAIN_SOLVER", "ASKSPEC_FROZEN_HOST", "ASKSPEC_INNER_WORKERS", "PHASE_DATA"} <= seen


def test_the_scan_finds_a_new_variable() -> None:
    """The scan is not a list: a variable a script starts reading is found, in arithmetic too."""
    text = 'set -eu\nX=${X-1}\nenv_check count X\necho "$NEW_ONE"\nif (( X * BARE > 2 )); then :; fi\ny=1\necho "$y"\n'
    assert env_reads(text) == {"X", "NEW_ONE", "BARE"}
    assert env_checks(text) == {"X": "count"}


@pytest.mark.parametrize("name", list(JOBS))
def test_hostile_values_of_every_variable_run_nothing(jobs, standins, tmp_path, name) -> None:
    """Every variable of every script of the job, each hostile value: refused with one line
    and exit 2 before anything runs (a path: refused when empty or an option, else passed on
    as data), and no payload runs. Scripts of one template that check the same variables
    are run once (the coverage test above and the property test below take every one)."""
    marker = tmp_path / "PWNED"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    distinct = {}
    for sh in scripts_of({name: jobs[name]}):
        distinct.setdefault((sh.name, tuple(sorted(env_checks(sh.read_text()).items()))), sh)
    for sh in distinct.values():
        text = sh.read_text()
        checks = env_checks(text)
        for var in sorted(env_reads(text) | set(checks)):
            kind = checks[var]
            values = [*payloads(marker), *UNIVERSAL, *BY_KIND[kind]]
            if kind == "path":  # one accepted value (it runs the script on), the refused ones
                values = ["".join(payloads(marker))] + ["-" + v for v in payloads(marker)] + UNIVERSAL
            for value in values:
                assert_refused_or_inert(sh, var, kind, value, standins, scratch, marker)


def test_a_required_variable_that_is_unset_is_refused(jobs, standins, tmp_path) -> None:
    scripts = [sh for sh in scripts_of(jobs) if required(sh.read_text())]
    assert scripts, "retrain.sh needs driver.sh's SAVE_PATH"
    for sh in scripts:
        needed = required(sh.read_text())
        for var in needed:
            env = {"PATH": f"{standins}:/usr/bin:/bin", "STANDIN_LOG": str(tmp_path / "log"),
                   **{other: str(tmp_path / other) for other in needed - {var}}}
            done = subprocess.run(["bash", str(sh)], env=env, capture_output=True, text=True, timeout=30)
            assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and var in done.stderr, done.stderr
            assert not (tmp_path / "log").exists()


_PIECES = ["$(", ")", "`", "[", "]", "$", "0", "08", "-", "+", "#", " ", "\n", "\t", "٣", "３", "é", "x", "1", "7",
           "10#", ";", "touch PWNED", "GPU-", ":", "/", ".", "@", "*"]
_hostile = st.lists(st.sampled_from(_PIECES) | st.text(st.characters(blacklist_categories=["Cs"],
                                                                      blacklist_characters="\0"), max_size=3),
                    max_size=5).map("".join)


@settings(max_examples=100, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_value_is_checked_as_its_kind(jobs, standins, tmp_path_factory, data) -> None:
    """Property: for any variable of any script and any value, the script refuses exactly
    the values its kind's rules refuse (one line, exit 2, nothing run), and no value runs
    as code."""
    scripts = scripts_of(jobs)
    sh = data.draw(st.sampled_from(scripts), label="script")
    checks = env_checks(sh.read_text())
    var = data.draw(st.sampled_from(sorted(checks)), label="variable")
    value = data.draw(_hostile, label="value")
    if checks[var] == "path" and sh.name in ("driver.sh", "retrain.sh"):
        value = "-" + value  # an accepted path starts the driver's steps: only refused ones here
    scratch = tmp_path_factory.mktemp("any")
    assert_refused_or_inert(sh, var, checks[var], value, standins, scratch, scratch / "PWNED")


# ------------------------------------------------------------------------ the cases
@pytest.fixture
def alternating(tmp_path) -> Path:
    job = tmp_path / "job"
    assert main(["compile", str(HERE / "specs" / "alternating.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    return job


def test_a_subscript_in_actor_gpus_runs_nothing(alternating, standins, tmp_path) -> None:
    """`ACTOR_GPUS='PWD[$(touch PWNED)]' bash launch.sh` ran `touch` inside launch.sh's
    arithmetic check, then submitted the job."""
    marker = tmp_path / "PWNED"
    for var in ("ACTOR_GPUS", "ACTOR_NODES"):
        done = run(alternating / "phase-1-proposer" / "launch.sh", standins, tmp_path,
                   {var: f"PWD[$(touch {marker})]"})
        assert not marker.exists()
        assert done.returncode == 2 and f"launch.sh: {var} must be a positive decimal integer" in done.stderr
        assert not (tmp_path / "standins.log").exists()


@pytest.mark.parametrize("script,var,value", [
    ("launch.sh", "ACTOR_GPUS", "08"),  # bash: an invalid octal, the check false; OpenRLHF: 8
    ("launch.sh", "ACTOR_GPUS", "0"),
    ("launch.sh", "VLLM_ENGINES", "-1"),
    ("launch.sh", "ACTOR_NODES", "10#1"),
    ("launch.sh", "ACTOR_GPUS", ""),  # set but empty: not the default
    ("sft.sh", "SFT_GPUS", "0"),  # a division by zero in the check, then deepspeed
    ("sft.sh", "MICRO_BATCH", "08"),
])
def test_numbers_the_checks_misread_are_refused(jobs, standins, tmp_path, script, var, value) -> None:
    job = jobs["pasodoble"]
    sh = sorted(job.glob(f"*/{script}"))[0]
    done = run(sh, standins, tmp_path, {var: value})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{script}: {var} must be a positive decimal integer"), done.stderr
    assert not (tmp_path / "standins.log").exists()


def test_sft_batch_not_divided_exits_2(jobs, standins, tmp_path) -> None:
    sh = sorted(jobs["pasodoble"].glob("*/sft.sh"))[0]
    done = run(sh, standins, tmp_path, {"SFT_GPUS": "7"})
    assert done.returncode == 2 and "must divide the stage's batch" in done.stderr
    assert not (tmp_path / "standins.log").exists()


@pytest.mark.parametrize("value", ["abc", "-1", "0", "", "02", "1 2"])
def test_the_driver_refuses_iterations_that_are_not_a_count(alternating, standins, tmp_path, value) -> None:
    """`ITERATIONS=abc`: seq failed inside `$(...)`, the loop ran zero times, and the driver
    said `done: final checkpoints ...` naming the initial weights, exit 0."""
    done = run(alternating / "driver.sh", standins, tmp_path, {"ITERATIONS": value})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("driver.sh: ITERATIONS must be a positive decimal integer"), done.stderr
    assert "done:" not in done.stdout
    assert not (tmp_path / "standins.log").exists() and not (alternating / "done").exists()


def test_the_driver_checks_what_its_scripts_read_before_starting_them(alternating, standins, tmp_path) -> None:
    """ACTOR_GPUS=08 passed to driver.sh: refused before the first phase's frozen servers start."""
    done = run(alternating / "driver.sh", standins, tmp_path, {"ACTOR_GPUS": "08"})
    assert done.returncode == 2 and done.stderr.startswith("driver.sh: ACTOR_GPUS must be"), done.stderr
    assert not (tmp_path / "standins.log").exists()


def test_the_closing_line_names_the_checkpoints_produced(alternating, tmp_path) -> None:
    """Each phase's job leaves its checkpoint (the stub writes it): the closing line names them."""
    out = tmp_path / "out"
    out.mkdir()
    calls = launch_argv(alternating / "driver.sh", out)
    assert len([c for c in calls if c[0] == "ray"]) == 4
    # run again: every step is done, the checkpoints are there
    again = subprocess.run(["bash", str(alternating / "driver.sh")], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": f"{out / 'stubs'}:{os.environ['PATH']}",
                                "STUB_LOG": str(out / "calls.log")})
    ckpt = alternating / "ckpt"
    assert again.stdout.splitlines()[-1] == (f"done: final checkpoints proposer={ckpt}/iter-2/proposer "
                                             f"solver={ckpt}/iter-2/solver")


def test_the_closing_line_says_when_no_checkpoint_was_produced(alternating, tmp_path) -> None:
    """Jobs that end without writing their checkpoints (a ray that saves nothing): the closing
    line said `done: final checkpoints proposer=.../iter-2/proposer ...`, folders that do not exist."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("ray", "exit 0"), ("curl", "exit 0"), ("vllm", "exec sleep 30")):
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    done = subprocess.run(["bash", str(alternating / "driver.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "done: no checkpoint was produced; every role keeps its initial weights"


# ------------------------------------------------------------------------------ serve_frozen.sh
def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _serving(tmp_path: Path, vllm: str, curl: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "vllm").write_text(vllm)
    (bindir / "curl").write_text(curl)
    for name in ("vllm", "curl"):
        (bindir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_stop_signals_only_the_servers_this_script_started(alternating, tmp_path) -> None:
    """A pid file left by a run killed with SIGKILL, whose pids were reused: `stop` ran
    `xargs kill` on every pid listed, whatever process had it now."""
    serve = alternating / "phase-1-proposer" / "serve_frozen.sh"
    other = subprocess.Popen(["sleep", "60"])
    try:
        logs = serve.parent / "logs"
        logs.mkdir(exist_ok=True)
        for stale in (f"{other.pid}\n", f"{other.pid} 12345\n"):  # the old format; another start time
            (logs / "frozen.pids").write_text(stale)
            subprocess.run(["bash", str(serve), "stop"], check=True, capture_output=True, timeout=30)
            time.sleep(0.2)
            assert other.poll() is None, "a process the script did not start was signalled"
            assert not (logs / "frozen.pids").exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_stop_ends_the_server_it_started(alternating, tmp_path) -> None:
    serve = alternating / "phase-1-proposer" / "serve_frozen.sh"
    env = _serving(tmp_path, "#!/bin/sh\nexec sleep 60\n", "#!/bin/sh\nexit 0\n")
    subprocess.run(["bash", str(serve)], env=env, check=True, capture_output=True, timeout=60)
    (line,) = (serve.parent / "logs" / "frozen.pids").read_text().splitlines()
    pid, start = line.split(" ", 1)
    assert _alive(int(pid)) and start == Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    # a second start stops what the first left (its pid file: a driver killed in between)
    subprocess.run(["bash", str(serve)], env=env, check=True, capture_output=True, timeout=60)
    deadline = time.time() + 10
    while _alive(int(pid)) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(int(pid))
    (line,) = (serve.parent / "logs" / "frozen.pids").read_text().splitlines()
    second = int(line.split()[0])
    subprocess.run(["bash", str(serve), "stop"], env=env, check=True, capture_output=True, timeout=30)
    deadline = time.time() + 10
    while _alive(second) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(second)
    assert not (serve.parent / "logs" / "frozen.pids").exists()


def test_a_server_that_dies_before_it_is_ready_stops_the_script(alternating, tmp_path) -> None:
    """`vllm serve` exits (out of memory, a bad model path): serve_frozen.sh polled its port
    forever. Now it stops, with the end of the server's log."""
    serve = alternating / "phase-1-proposer" / "serve_frozen.sh"
    env = _serving(tmp_path, "#!/bin/sh\necho 'torch.OutOfMemoryError: CUDA out of memory'\nexit 1\n",
                   "#!/bin/sh\nexit 7\n")
    started = time.time()
    done = subprocess.run(["bash", str(serve)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and time.time() - started < 20
    assert "the vLLM server on port 8001 exited before it answered" in done.stderr
    assert "CUDA out of memory" in done.stderr
    assert not (serve.parent / "logs" / "frozen.pids").exists()

