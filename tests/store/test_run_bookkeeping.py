"""Run bookkeeping that survives faults (issue 30, item 5): a run's totals and duration
accumulate over every process that ran it, a process killed before its end included (its
turns on disk are counted at the resume); a run whose process is gone is shown as
`crashed` (pid checked on its host) or `stale` (another host, no heartbeat), in the `runs`
view (`askspec query`), in `askspec runs` and in the TUI, by one function
(runtime/store/liveness.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from askspec.runtime.commands.runs import list_runs
from askspec.runtime.store import layout, liveness
from askspec.runtime.store.views import open_store
from askspec.runtime.store.writer import RunWriter


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # (not reused this soon)


def _set_last_process(run_dir, **fields) -> None:
    m = layout.read_manifest(run_dir)
    m["history"][-1].update(fields)
    layout.write_json_atomic(layout.manifest_path(run_dir), m)


def _rows_totals(run_dir) -> dict:
    con = open_store(str(run_dir))
    n, t_in, t_out = con.execute("SELECT count(*), sum(tokens_in), sum(tokens_out) FROM events_turns").fetchone()
    return {"turns": n, "tokens_in": t_in, "tokens_out": t_out}


def _killed(kit, w: RunWriter, pid: int) -> None:
    """The process of `w` is killed with SIGKILL: no finish(), and its pid is gone."""
    w.close()
    _set_last_process(w.run_dir, pid=pid)


def test_totals_and_duration_accumulate_over_killed_processes(kit, tmp_path):
    dead = _dead_pid()
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    kit.play_session(w, 1, turns=2, finish=False)
    time.sleep(0.3)
    kit.play_session(w, 2, turns=1, finish=False)  # its last event: the killed process's last sign of life
    _killed(kit, w, dead)
    gen0 = _rows_totals(w.run_dir)
    assert gen0 == {"turns": 5, "tokens_in": 10 + 11 + 10 + 11 + 10, "tokens_out": 25}

    w = RunWriter.open_for_resume(w.run_dir, flush_interval=0)  # killed again
    kit.play_session(w, 1, turns=3)
    _killed(kit, w, dead)

    w = RunWriter.open_for_resume(w.run_dir, flush_interval=0)
    kit.play_session(w, 2, turns=2)
    w.finish()

    m = layout.read_manifest(w.run_dir)
    rows = _rows_totals(w.run_dir)
    assert rows["turns"] == 5 + 3 + 2
    assert m["totals"] == rows  # every process's turns, not the last one's
    per_process = [h["totals"] for h in m["history"]]
    assert per_process[0] == gen0
    assert per_process[1] == {"turns": 3, "tokens_in": 33, "tokens_out": 15}
    assert per_process[2] == {"turns": 2, "tokens_in": 21, "tokens_out": 10}
    assert [h.get("killed", False) for h in m["history"]] == [True, True, False]
    # the duration covers the killed processes too, each to its last sign of life
    spans = [liveness.seconds(h["ended_at"]) - liveness.seconds(h["started_at"]) for h in m["history"]]
    assert spans[0] >= 0.3
    assert m["duration_s"] == pytest.approx(sum(spans), abs=0.01)
    # the runs listing agrees
    (listed,) = list_runs(w.run_dir)
    assert (listed["turns"], listed["tokens_in"], listed["tokens_out"]) == (rows["turns"], rows["tokens_in"],
                                                                         rows["tokens_out"])
    assert listed["status"] == "finished" and listed["duration_s"] == m["duration_s"]


def test_shown_status_decides_from_pid_host_and_heartbeat(monkeypatch):
    now = time.time()
    fresh, old = layout.utc_iso(now - 5), layout.utc_iso(now - liveness.STALE_S - 60)
    here = liveness.host()
    me = {"pid": __import__("os").getpid(), "host": here, "started_at": old, "heartbeat_at": fresh}
    assert liveness.shown_status("running", me, now) == "running"
    assert liveness.shown_status("running", {**me, "pid": _dead_pid()}, now) == "crashed"
    assert liveness.shown_status("running", {**me, "heartbeat_at": old}, now) == "stale"  # a reused pid, or hung
    elsewhere = {"pid": 1, "host": here + "-elsewhere", "started_at": old}
    assert liveness.shown_status("running", {**elsewhere, "heartbeat_at": fresh}, now) == "running"
    assert liveness.shown_status("running", {**elsewhere, "heartbeat_at": old}, now) == "stale"
    # an older version's entry (no host, no heartbeat): the pid alone
    assert liveness.shown_status("running", {"pid": _dead_pid(), "started_at": old}, now) == "crashed"
    assert liveness.shown_status("running", {"pid": me["pid"], "started_at": old}, now) == "running"
    for status in ("finished", "failed", "interrupted"):
        assert liveness.shown_status(status, {**me, "pid": _dead_pid()}, now) == status


def test_a_killed_run_is_crashed_in_the_view_the_listing_and_the_tui(kit, tmp_path):
    from askspec.tui import data

    w = kit.new_writer(tmp_path / "runs", flush_interval=0)
    kit.play_session(w, 0)
    kit.play_session(w, 1, finish=False)
    source = data.Source(tmp_path / "runs")
    before = data.fingerprint(tmp_path / "runs")
    con = open_store(str(tmp_path / "runs"))  # a long-lived reader: the status is decided at each query
    assert con.execute("SELECT status FROM runs").fetchall() == [("running",)]
    (info,) = data.list_runs(source)
    assert info.status == "running" and info.live

    _killed(kit, w, _dead_pid())
    assert data.fingerprint(tmp_path / "runs") != before  # the TUI's follow mode reloads
    assert con.execute("SELECT status FROM runs").fetchall() == [("crashed",)]
    (info,) = data.list_runs(source)
    assert info.status == "crashed" and not info.live
    (listed,) = list_runs(tmp_path / "runs")
    assert listed["status"] == "crashed"
    assert listed["turns"] == 4 and listed["tokens_in"] == 42  # counted from its turns: it recorded no totals
    assert listed["duration_s"] is not None and listed["duration_s"] >= 0
    source.close()

    # on another host, a run is stale once its heartbeat is old
    _set_last_process(w.run_dir, host="elsewhere.example", started_at="2020-01-01T00:00:00.000000Z",
                      heartbeat_at="2020-01-01T00:10:00.000000Z")
    assert con.execute("SELECT status FROM runs").fetchall() == [("stale",)]
    _set_last_process(w.run_dir, heartbeat_at=layout.utc_iso())
    assert con.execute("SELECT status FROM runs").fetchall() == [("running",)]


def test_the_heartbeat_records_the_process_alive_with_its_totals(kit, tmp_path, monkeypatch):
    monkeypatch.setattr(liveness, "HEARTBEAT_S", 0.05)
    w = kit.new_writer(tmp_path, flush_interval=0)
    started = layout.read_manifest(w.run_dir)["history"][-1]["heartbeat_at"]
    kit.play_session(w, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        last = layout.read_manifest(w.run_dir)["history"][-1]
        if last["heartbeat_at"] > started and (last.get("totals") or {}).get("turns") == 2:
            break
        time.sleep(0.02)
    assert last["heartbeat_at"] > started and last["totals"] == {"turns": 2, "tokens_in": 21, "tokens_out": 10}
    assert last["host"] == liveness.host()
    w.finish()
    m = layout.read_manifest(w.run_dir)
    time.sleep(0.2)
    assert layout.read_manifest(w.run_dir) == m  # no beat after the end
    assert m["history"][-1]["totals"]["turns"] == 2 and json.dumps(m)


def test_a_killed_process_not_yet_reaped_is_not_alive():
    """Right after `kill -9` a run's process is a zombie until it is reaped; it still
    answers kill(pid, 0), and the run must read `crashed` at once, not a second later."""
    import subprocess
    import sys
    import time

    from askspec.runtime.store.liveness import pid_alive

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_alive(proc.pid)
        proc.kill()
        time.sleep(0.3)  # dead, not reaped: a zombie of this process
        assert not pid_alive(proc.pid)
    finally:
        proc.wait()
    assert not pid_alive(proc.pid)
