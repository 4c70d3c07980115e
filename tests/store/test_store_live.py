"""Query a run while a separate writer process appends to it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import askspec
from askspec.runtime.commands.query import cmd_query, query

WRITER = r"""
import sys, time
from pathlib import Path
from askspec.runtime.store.writer import RunWriter

w = RunWriter.create(sys.argv[1], experiment="live", experiment_hash="0" * 64, ir_json="{}",
                     spec_files={}, seed=0, roles={}, params={}, planned_sessions=0,
                     argv=sys.argv, flush_interval=0.02)
print(w.run_dir, flush=True)
# Writes until the test creates the stop file (it has queried enough), at most 120 s.
stop = Path(sys.argv[2])
deadline = time.monotonic() + 120
i = 0
while time.monotonic() < deadline and not stop.exists():
    sid = f"s{i}"
    a = w.session_started(sid, game="g", group_id=None, params={"i": i}, index=i)
    for t in range(3):
        w.turn(sid, a, turn_index=t, role="r", model="m", prompt=[{"role": "user", "content": "x" * 300}],
               text="y" * 500, parsed={"t": t}, finish_reason="stop", tokens_in=1, tokens_out=1,
               latency_ms=0.1)
    w.reward(sid, a, role="r", turn_index=None, name="score", value=1.0, kind="terminal")
    w.session_finished(sid, a, status="ok", outcome="done", error=None, vars={})
    i += 1
    time.sleep(0.002)
w.finish()
print(i, flush=True)
"""


def test_query_while_another_process_writes(tmp_path, capsys):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = dict(os.environ)
    # Let the child import askspec the same way this process does.
    pkg_root = str(Path(askspec.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_root, env.get("PYTHONPATH", "")])
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_dir = proc.stdout.readline().strip()
        assert run_dir, proc.stderr.read()
        counts = []
        # Query while the writer writes, however slow the machine: the writer goes on
        # until ten queries have seen it mid-run.
        while proc.poll() is None and len(counts) < 10:
            t = query(run_dir, "SELECT (SELECT count(*) FROM sessions WHERE status = 'ok') AS ok, "
                               "(SELECT count(*) FROM turns) AS turns").to_pylist()[0]
            # Flush order guarantees a finished session's turns are already on disk.
            assert t["turns"] >= 3 * t["ok"]
            counts.append(t["ok"])
            if len(counts) % 4 == 0:  # and the CLI handler, as `askspec query` runs it
                args = type("A", (), {"run_dir": run_dir, "sql": "SELECT count(*) AS n FROM turns",
                                      "format": "csv", "max_width": 40})
                assert cmd_query(args) == 0
                assert "error" not in capsys.readouterr().err
            time.sleep(0.05)
        stop.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    written = int(out.split()[-1])
    assert len(counts) >= 10, counts
    assert counts == sorted(counts) and counts[-1] > counts[0], counts
    final = query(run_dir, "SELECT count(*) AS n FROM sessions WHERE status = 'ok'").to_pylist()
    assert final == [{"n": written}]
