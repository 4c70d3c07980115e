"""job.json is one pydantic model (runtime/targets/openrlhf/jobfile.py): what the generator
writes is what every reader loads, and a file of another format, a multi-policy job's top
file given for a phase's, a garbled or foreign file is refused with a sentence naming the
file and the remedy — by the agent, the phase-data commands and the extension's hooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.targets.openrlhf import jobfile

SPECS = Path(__file__).parent / "specs"


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("jobfile") / "job"
    assert main(["compile", str(SPECS / "stages.ask"), "--target", "openrlhf", "-o", str(out)]) == 0
    return out


def _phase(job: Path) -> Path:
    return next(p.parent for p in sorted(job.rglob("job.json")) if "agent.py" in {q.name for q in p.parent.iterdir()})


def test_what_the_generator_writes_every_reader_loads(job):
    phase = _phase(job)
    loaded = jobfile.read_phase_job(phase)
    assert loaded.format == jobfile.FORMAT and loaded.trained_role == "s" and loaded.group >= 1
    assert loaded.ir().name  # the IR parses
    assert jobfile.read_phase_job(phase / "job.json") == loaded  # the file or its folder
    # written from the model: the file is the model's own text, nothing else in it
    assert (phase / "job.json").read_text(encoding="utf-8") == loaded.text()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: {**d, "format": 0}, "has format 0; this askspec reads format 1"),
    (lambda d: {k: v for k, v in d.items() if k != "format"}, "has format None; this askspec reads format 1"),
    (lambda d: {**d, "group": "many"}, "group: Input should be a valid integer"),
    (lambda d: {k: v for k, v in d.items() if k != "trained_role"}, "trained_role: Field required"),
    (lambda d: {**d, "max_tokens": 5}, "max_tokens: Extra inputs are not permitted"),
    (lambda d: [1, 2], "is not a job file (not a JSON object)"),
    (lambda d: {"format": 1, "kind": "multi_policy", "roles": {"a": "phase-1-a"}},
     "is the multi-policy job's top file, not a phase's: give one of its role folders (a)"),
])
def test_a_foreign_file_is_refused_with_the_file_and_the_remedy(job, tmp_path, change, message):
    data = json.loads((_phase(job) / "job.json").read_text(encoding="utf-8"))
    bad = tmp_path / "job.json"
    bad.write_text(json.dumps(change(data)), encoding="utf-8")
    with pytest.raises(jobfile.JobFileError) as info:
        jobfile.read_phase_job(tmp_path)
    assert str(bad) in str(info.value) and message in str(info.value)
    assert "compile the job again" in str(info.value) or "role folders" in str(info.value)


def test_garbled_and_missing_files(tmp_path):
    (tmp_path / "job.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(jobfile.JobFileError, match=r"is not JSON \(line 1: .*compile the job again"):
        jobfile.read_phase_job(tmp_path)
    with pytest.raises(jobfile.JobFileError, match="no job file here"):
        jobfile.read_phase_job(tmp_path / "elsewhere")


def test_the_phase_data_commands_and_the_agent_refuse_an_old_file(job, tmp_path, capsys):
    """The readers go through the model: an old file is a one-line refusal, no traceback."""
    import shutil

    from askspec.runtime.targets.openrlhf import phase_data
    from askspec.runtime.targets.openrlhf.adapter import GameAgent

    root = tmp_path / "job"
    shutil.copytree(job, root)
    phase = _phase(root)
    data = json.loads((phase / "job.json").read_text(encoding="utf-8"))
    (phase / "job.json").write_text(json.dumps({**data, "format": 0}), encoding="utf-8")
    with pytest.raises(jobfile.JobFileError, match="compile the job again with this askspec"):
        GameAgent(phase)
    assert phase_data.main(["prompts", str(root), str(phase.relative_to(root))]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "has format 0; this askspec reads format 1" in err and "Traceback" not in err
