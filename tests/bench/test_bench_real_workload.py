"""The pure parts of bench/bench_real_workload.py: arguments, which server to start and
its command line, the server log, the schedule and the tables. No timings here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_real_workload as bench  # noqa: E402
from bench_real_workload import Config, Measure  # noqa: E402


def test_defaults_are_the_issue_workload_and_sizes_are_configurable():
    a = bench.parse_args([])
    assert (a.sessions, a.max_tokens, a.probes, a.repeat, a.concurrency, a.seed) == (8, 96, 1, 2, (1, 8), 0)
    a = bench.parse_args(["--sessions", "2", "--max-tokens", "8", "--repeat", "1", "--concurrency", "2, 1,2"])
    assert (a.sessions, a.max_tokens, a.repeat, a.concurrency) == (2, 8, 1, (2, 1))


@pytest.mark.parametrize("argv", [["--sessions", "0"], ["--concurrency", ","], ["--max-tokens", "x"]])
def test_bad_sizes_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_the_server_comes_from_the_environment():
    assert bench.server_from_env({}) is None
    assert bench.server_from_env({"LLAMA_SERVER": "/opt/llama-server"}) == ("binary", "/opt/llama-server")
    both = {"LLAMACPP_PYTHON": "/v/bin/python", "LLAMA_SERVER": "/opt/llama-server"}
    assert bench.server_from_env(both) == ("python", "/v/bin/python")


def test_server_command_lines():
    py = bench.server_command("python", "/v/bin/python", "/m.gguf", 8123, 1, 4096)
    assert py[:3] == ["/v/bin/python", "-m", "llama_cpp.server"]
    assert _flag(py, "--model") == "/m.gguf" and _flag(py, "--port") == "8123" and _flag(py, "--host") == "127.0.0.1"
    assert _flag(py, "--n_threads") == _flag(py, "--n_threads_batch") == "1" and _flag(py, "--n_ctx") == "4096"
    assert _flag(py, "--model_alias") == "smollm2-135m-instruct"
    binary = bench.server_command("binary", "/opt/llama-server", "/m.gguf", 8123, 2, 2048)
    assert binary[0] == "/opt/llama-server" and _flag(binary, "--threads") == _flag(binary, "--threads-batch") == "2"
    assert _flag(binary, "--parallel") == "1" and _flag(binary, "--alias") == "smollm2-135m-instruct"
    with pytest.raises(ValueError):
        bench.server_command("docker", "x", "/m.gguf", 1, 1, 1)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_server_log_prompt_evaluations():
    log = ("Llama.generate: 310 prefix-match hit, remaining 45 prompt tokens to eval\n"
           "llama_perf_context_print:        load time =     120.50 ms\n"
           "llama_perf_context_print: prompt eval time =      98.25 ms /    45 tokens (    2.18 ms per token)\n"
           "llama_perf_context_print:        eval time =    2100.00 ms /    95 runs   (   22.11 ms per token)\n"
           "slot print_timing: id  0 | task 3 | \n"
           "prompt eval time =     512.00 ms /   400 tokens (    1.28 ms per token,   781.25 tokens per second)\n"
           "       eval time =    3000.00 ms /    96 tokens\n")
    assert bench.parse_server_log(log) == [(98.25, 45), (512.0, 400)]
    assert bench.parse_server_log("nothing here") == []


def test_schedule_interleaves_and_alternates_the_order():
    configs = bench.configurations((1, 8), server=True)
    assert configs == [Config("hf", 1), Config("llama.cpp", 1), Config("hf", 8), Config("llama.cpp", 8)]
    assert bench.configurations((1,), server=False) == [Config("hf", 1)]
    order = bench.schedule(configs, 3)
    assert order[:4] == configs and order[4:8] == configs[::-1] and order[8:] == configs


def test_run_arguments_send_only_the_server_runs_to_the_server():
    a = bench.parse_args(["--sessions", "3", "--max-tokens", "16", "--probes", "2", "--seed", "5"])
    hf = bench.run_args(a, Config("hf", 8), "/tmp/o", None)
    assert hf == dict(out="/tmp/o", eval_only=True, sessions=3, seed=5, set=["probes=2"], max_tokens=16,
                      concurrency=8, quiet=True)
    ll = bench.run_args(a, Config("llama.cpp", 1), "/tmp/o", "http://127.0.0.1:9/v1")
    assert ll["backend"] == "openai" and ll["base_url"] == "http://127.0.0.1:9/v1" and ll["concurrency"] == 1
    assert bench.cli_line(a, Config("llama.cpp", 1)).endswith("--concurrency 1 --backend openai "
                                                              "--base-url http://127.0.0.1:PORT/v1")


def _m(wall, out, **kw):
    return Measure(wall_s=wall, sessions_ok=8, sessions=8, calls=10, tokens_in=4000, tokens_out=out, **kw)


def test_measures_prefer_the_server_figures_and_fall_back_to_the_store():
    hf = _m(10.0, 200, ttft_ms=[100.0, 300.0, 200.0], ttft_tokens_in=1200)
    assert hf.gen_tps == 20.0 and hf.prefill_tps == 2000.0 and hf.ttft_median_ms == 200.0
    server = _m(5.0, 200, ttft_ms=[], server_prompt_ms=[50.0, 150.0], server_prompt_tokens=300)
    assert server.prefill_tps == 1500.0 and server.ttft_median_ms == 100.0
    assert _m(1.0, 10).prefill_tps is None and _m(1.0, 10).ttft_median_ms is None


def test_table_shows_the_median_run_and_each_run_and_the_ratios():
    results = {Config("hf", 1): [_m(30.0, 300), _m(10.0, 300), _m(20.0, 300)],
               Config("llama.cpp", 1): [_m(10.0, 300)],
               Config("hf", 8): [_m(5.0, 300)],
               Config("llama.cpp", 8): []}
    lines = bench.table(results)
    assert lines[0].startswith("configuration") and len(lines) == 4  # a configuration without runs is left out
    row = lines[1]
    assert row.startswith("hf, concurrency 1") and " 20.0 " in row and row.endswith("30.0, 10.0, 20.0")
    assert " 8/8 " in row and " 15.0 " in row  # 300 tokens / 20 s
    assert bench.ratios(results) == ["concurrency 1: hf / llama.cpp generated tok/s = 0.50",
                                     "hf: concurrency 8 / 1 generated tok/s = 4.00"]


def test_a_quantized_hf_configuration_is_measured_beside_the_others():
    configs = bench.configurations((1, 8), server=True, quantize="int8")
    assert configs == [Config("hf", 1), Config("hf int8", 1), Config("llama.cpp", 1),
                       Config("hf", 8), Config("hf int8", 8), Config("llama.cpp", 8)]
    assert bench.configurations((1,), server=False, quantize="none") == [Config("hf", 1)]
    assert [bench.hf_quantize(c) for c in configs[:3]] == ["none", "int8", "none"]
    a = bench.parse_args([])
    assert a.hf_quantize == "int8,fp16" and bench.parse_args(["--hf-quantize", "none"]).hf_quantize == "none"
    assert bench.configurations((1,), server=False, quantize=a.hf_quantize) == [
        Config("hf", 1), Config("hf int8", 1), Config("hf fp16", 1)]
    assert bench.hf_quantize(Config("hf fp16", 8)) == "fp16"
    with pytest.raises(SystemExit):
        bench.parse_args(["--hf-quantize", "int4"])
    assert bench.cli_line(a, Config("hf int8", 1)).endswith('(every hf model with quantize = "int8")')
    assert bench.run_args(a, Config("hf int8", 8), "/tmp/o", None) == bench.run_args(a, Config("hf", 8), "/tmp/o", None)
    results = {Config("hf", 1): [_m(10.0, 100)], Config("hf int8", 1): [_m(10.0, 150)],
               Config("llama.cpp", 1): [_m(10.0, 200)], Config("hf", 8): [_m(10.0, 300)],
               Config("hf int8", 8): [_m(10.0, 600)], Config("llama.cpp", 8): [_m(10.0, 200)]}
    assert bench.ratios(results) == ["concurrency 1: hf / llama.cpp generated tok/s = 0.50",
                                     "concurrency 1: hf int8 / llama.cpp generated tok/s = 0.75",
                                     "concurrency 8: hf / llama.cpp generated tok/s = 1.50",
                                     "concurrency 8: hf int8 / llama.cpp generated tok/s = 3.00",
                                     "hf: concurrency 8 / 1 generated tok/s = 3.00",
                                     "hf int8: concurrency 8 / 1 generated tok/s = 4.00",
                                     "llama.cpp: concurrency 8 / 1 generated tok/s = 1.00"]
