"""RunCheckpoints: the order a step's checkpoint is written in. latest.json is the commit
point, so what an older checkpoint needs to be resumed from stays until the newer one is
committed; a kill anywhere before that resumes from the older one, whole."""

from __future__ import annotations

import json
from pathlib import Path

from askspec.runtime.train.checkpoints import BUFFERS, STAGES, RunCheckpoints


def _write_step(book: RunCheckpoints, step: int) -> None:
    for role in book.roles:
        folder = book.folder(role, step)
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"")
        (folder / "optimizer.safetensors").write_bytes(b"")
    book.write_state(BUFFERS, step, {"pool": {"items": [step]}})
    book.write_state(STAGES, step, {"stopped": {}, "at": step})


def test_a_step_not_yet_committed_leaves_the_previous_checkpoint_whole(tmp_path: Path):
    book = RunCheckpoints(tmp_path, ("a", "b"))
    assert book.latest() == 0 and book.newest_words() == "none was written"
    _write_step(book, 1)
    book.commit(1, keep=2)
    _write_step(book, 2)  # killed here, before the commit
    assert book.named_step() == 1 and book.latest() == 1
    assert book.state(STAGES, 1) == {"stopped": {}, "at": 1} and book.state(BUFFERS, 1) == {"pool": {"items": [1]}}
    assert (book.folder("a", 1) / "optimizer.safetensors").exists()
    book.commit(2, keep=2)
    assert json.loads((book.root / "latest.json").read_text()) == {"step": 2, "roles": {"a": "a/step-2", "b": "b/step-2"}}
    assert book.state(STAGES, 1) is None and book.state(BUFFERS, 1) is None  # only the newest is resumed from
    assert book.state(STAGES, 2) == {"stopped": {}, "at": 2}
    assert not (book.folder("a", 1) / "optimizer.safetensors").exists()  # the newest alone keeps AdamW's moments
    assert book.steps_of_every_role() == [1, 2] and book.newest_words() == "the newest is step 2"


def test_only_the_newest_keep_folders_stay(tmp_path: Path):
    book = RunCheckpoints(tmp_path, ("a",))
    for step in (1, 2, 3):
        _write_step(book, step)
        book.commit(step, keep=2)
    assert book.steps_of_every_role() == [2, 3]


def test_a_named_step_whose_folders_were_moved_aside_resumes_from_the_newest_every_role_has(tmp_path: Path):
    book = RunCheckpoints(tmp_path, ("a", "b"))
    for step in (1, 2):
        _write_step(book, step)
        book.commit(step, keep=3)
    book.folder("b", 2).rename(book.root / "b" / "damaged-step-2")
    assert book.named_step() == 2 and book.latest() == 1
