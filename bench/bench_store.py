"""Run-store benchmark: RunWriter throughput and typical queries, NDJSON vs Parquet.

Writes an Ask-E-shaped run (default 100k sessions x 10 turns over 4 roles, 190
boundary pairs as groups; the questioner keeps its whole conversation, so its
prompts grow) through ``RunWriter``, then times typical aggregations on the
NDJSON views, compacts the run to Parquet and times them again.

    PYTHONPATH=<dir with askspec> python bench/bench_store.py [--sessions 100000] [--keep]

Query times are the median of ``--repeat`` warm runs (the files are in the OS
page cache after the first), each on a fresh ``open_store`` connection, as a
CLI ``askspec query`` or a TUI refresh would do.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from askspec.runtime.store.compact import compact_run
from askspec.runtime.store.views import open_store
from askspec.runtime.store.writer import RunWriter

ROLES = ("questioner", "boundary_a", "boundary_b", "answer_key")
MODELS = [f"model-{i:02d}" for i in range(20)]
PAIRS = list(itertools.combinations(MODELS, 2))  # 190 unordered boundary pairs
OUTCOMES = ("calibrated", "too_easy", "too_hard")

QUERIES = {
    "outcome counts by group": """
        SELECT group_id, outcome, count(*) AS n FROM sessions GROUP BY ALL""",
    "mean reward by role": """
        SELECT role, avg(value) AS mean, count(*) AS n FROM rewards GROUP BY role""",
    "calibration rate per pair": """
        SELECT params->>'$.a' AS a, params->>'$.b' AS b,
               avg(CASE WHEN outcome = 'calibrated' THEN 1.0 ELSE 0.0 END) AS rate, count(*) AS n
        FROM sessions WHERE status = 'ok' GROUP BY ALL""",
    "turns per role": """
        SELECT role, count(*) AS n FROM turns GROUP BY role""",
    "tokens and latency per role": """
        SELECT role, avg(tokens_out) AS tok, quantile_cont(latency_ms, 0.9) AS p90
        FROM turns GROUP BY role""",
    "one session's turns (TUI)": """
        SELECT turn_index, role, text FROM turns WHERE session_id = 's0050000' ORDER BY turn_index""",
    # Prompts are stored as deltas; these rebuild them (one session, then every turn).
    "one session's full prompts (TUI)": """
        SELECT turn_index, role, prompt FROM turns WHERE session_id = 's0050000' ORDER BY turn_index""",
    "prompt messages per role (all turns)": """
        SELECT role, avg(json_array_length(prompt)) AS messages FROM turns GROUP BY role""",
}

# A small pool of realistic texts, picked by index so generation costs little.
TEXT_POOL = [
    ("#Reasoning# The boundary models disagree on modular arithmetic, so probe there. "
     f"#Draft# Find the remainder of 7^{k} divided by 13. "
     f"#Question# What is the remainder when 7^{k} is divided by 13? Give the answer in \\boxed{{}}.")
    * (1 + k % 3)
    for k in range(64)
]
SYSTEM = ("You are a questioner. Write a question that exactly one of two models answers correctly. "
          "Reply with #Reasoning#, #Draft# and #Question# sections.")


def write_run(out: Path, sessions: int, turns: int, flush_interval: float) -> tuple[Path, dict]:
    w = RunWriter.create(
        out, experiment="ask_e_bench", experiment_hash="ab" * 32, ir_json="{}",
        spec_files={"ask_e.ask": "experiment ask_e {}\n"}, seed=0,
        roles={r: {"backend": "replay", "model": "smollm2-135m"} for r in ROLES},
        params={"probes": 4}, planned_sessions=sessions, argv=sys.argv,
        flush_interval=flush_interval,
    )
    events = turn_events = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(sessions):
        a_model, b_model = PAIRS[i % len(PAIRS)]
        group = f"{a_model}|{b_model}"
        sid = f"s{i:07d}"
        att = w.session_started(sid, game="calibrate", group_id=group,
                                params={"a": a_model, "b": b_model, "repeat": i // len(PAIRS)}, index=i)
        history = [{"role": "system", "content": SYSTEM}]
        for t in range(turns):
            role = ROLES[t % 4]
            # Unique per turn, so compression ratios are not flattered by exact repeats.
            text = f"{TEXT_POOL[(i + t) % 64]} [{i}.{t}: {(i * 2654435761 + t) % 1000003}]"
            prompt = history if role == "questioner" else [
                {"role": "system", "content": "Answer the question; end with #Summary#."},
                {"role": "user", "content": TEXT_POOL[(i + t + 1) % 64][-120:]}]
            w.turn(sid, att, turn_index=t, role=role, model=a_model if role == "boundary_a" else b_model,
                   prompt=prompt, text=text,
                   parsed={"question": text[-110:], "reasoning_ok": True} if role == "questioner" else
                   {"answer": str((i + t) % 13)},
                   finish_reason="stop", tokens_in=180 + 7 * t, tokens_out=60 + (i + t) % 90,
                   latency_ms=40.0 + (i * 7 + t) % 500)
            if role == "questioner":
                w.reward(sid, att, role=role, turn_index=t, name="format", value=-0.05 * ((i + t) % 2),
                         kind="turn")
                events += 1
                # memory = full: the questioner's conversation grows with each probe
                # (the writer stores only what each prompt adds to the last one).
                history = history + [{"role": "assistant", "content": text},
                                     {"role": "user", "content": "Write the next probe."}]
        outcome = OUTCOMES[i % 3]
        w.reward(sid, att, role="questioner", turn_index=None, name="calibration",
                 value={"calibrated": 1.0, "too_easy": 0.2, "too_hard": -0.2}[outcome], kind="terminal")
        w.session_finished(sid, att, status="ok" if i % 97 else "error", outcome=outcome,
                           error=None if i % 97 else "backend timeout", vars={"k": 4})
        events += turns + 3
        turn_events += turns
    for a_model, b_model in PAIRS:
        w.group(f"{a_model}|{b_model}", route="pairs", stats={"n": sessions // len(PAIRS)},
                members=[])
        events += 1
    w.finish()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    sizes = {p.name: p.stat().st_size for p in (w.run_dir / "events").glob("*.ndjson")}
    return w.run_dir, {"seconds": dt, "cpu": cpu, "events": events, "turns": turn_events, "bytes": sum(sizes.values()),
                       "turns_bytes": sizes["turns.ndjson"]}


def time_queries(run_dir: Path, repeat: int) -> dict[str, float]:
    out = {}
    for name, sql in QUERIES.items():
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            con = open_store(run_dir)
            con.sql(sql).to_arrow_table()
            con.close()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flush-interval", type=float, default=0.2)
    ap.add_argument("--out", type=Path, default=None, help="where to write the run (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args(argv)

    out = args.out or Path(tempfile.mkdtemp(prefix="bench_store_"))
    print(f"# bench_store  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  "
          f"duckdb {duckdb.__version__}  {os.cpu_count()} cpus  load {os.getloadavg()[0]:.1f}  out={out}")
    try:
        run_dir, w = write_run(out, args.sessions, args.turns, args.flush_interval)
        print(f"write: {w['events']:,} events ({w['turns']:,} turns) in {w['seconds']:.2f} s = "
              f"{w['events'] / w['seconds']:,.0f} events/s, {w['turns'] / w['seconds']:,.0f} turns/s "
              f"(per CPU-second of the writer process: {w['events'] / w['cpu']:,.0f} events/s); "
              f"NDJSON {w['bytes'] / 1e6:,.0f} MB (turns {w['turns_bytes'] / w['turns']:.0f} B/line)")

        nd = time_queries(run_dir, args.repeat)
        t0 = time.perf_counter()
        compact_run(run_dir)
        compact_s = time.perf_counter() - t0
        pq_bytes = sum(p.stat().st_size for p in (run_dir / "events").glob("*.parquet"))
        print(f"compact: {compact_s:.2f} s, Parquet {pq_bytes / 1e6:,.0f} MB (zstd)")
        pq = time_queries(run_dir, args.repeat)

        width = max(len(n) for n in QUERIES)
        print(f"\n| {'query'.ljust(width)} | NDJSON (s) | Parquet (s) |")
        print(f"|{'-' * (width + 2)}|-----------:|------------:|")
        for name in QUERIES:
            print(f"| {name.ljust(width)} | {nd[name]:10.3f} | {pq[name]:11.3f} |")
        print(f"\n(load average at end: {os.getloadavg()[0]:.1f})")
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
