"""Size limits on what a run loads (issue #25, item 3): one data record past
MAX_RECORD_BYTES is refused at check time (E304, file:line) and at load time (jsonl line,
parquet row); an sft record longer than the model's context is refused, never cut; a
model whose config has more parameters than the memory available is refused before
anything is allocated, for serving and for training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.ir import model as ir
from askspec.lang.training import lower_training
from askspec.lang.compiler import compile_file
from askspec.lang.paths import MAX_RECORD_BYTES
from askspec.runtime.backends.base import BackendError
from askspec.runtime.engine.plan import load_dataset

SPEC = """model m = hf("smollm2-135m-instruct")
role r { model = m; prompt = "{{ x.prompt }}" }
data d = jsonl("d.jsonl")
game g for x in d { y = ask r }
"""


def write_records(path: Path, sizes: list[int], newline_at_end: bool = True) -> None:
    """JSON lines whose encoded length (newline included) is each of `sizes`."""
    lines = []
    for size in sizes:
        empty = json.dumps({"prompt": ""}) + "\n"
        lines.append(json.dumps({"prompt": "x" * (size - len(empty))}) + "\n")
    text = "".join(lines)
    path.write_text(text if newline_at_end else text[:-1])


@pytest.mark.parametrize("sizes, end, bad_line", [
    ([100, MAX_RECORD_BYTES, 100, MAX_RECORD_BYTES], True, None),  # at the limit: accepted
    ([100, 50 * MAX_RECORD_BYTES, 100], True, 2),  # the 50 MB prompt
    ([MAX_RECORD_BYTES + 1], True, 1),
    ([100, 10, MAX_RECORD_BYTES + 2], False, 3),  # the last line without its newline
])
def test_a_record_past_the_limit_is_refused_at_check_and_load_time(tmp_path, sizes, end, bad_line):
    write_records(tmp_path / "d.jsonl", sizes, end)
    (tmp_path / "s.ask").write_text(SPEC)
    res = compile_file(str(tmp_path / "s.ask"))
    errs = [(d.code, d.message) for d in res.sink.sorted() if d.is_error]
    ds = ir.Dataset(name="d", format="jsonl", path="d.jsonl")
    if bad_line is None:
        assert errs == []
        assert len(load_dataset(ds, str(tmp_path), 0)) == len(sizes)
        return
    (code, message), = errs
    assert code == "E304" and message.startswith(f"data file refused: d.jsonl:{bad_line}: a record of ")
    assert f"more than the limit of {MAX_RECORD_BYTES:,} bytes" in message
    with pytest.raises(ValueError, match=rf"^d.jsonl:{bad_line}: a record of [\d,]+ bytes, more than the limit"):
        load_dataset(ds, str(tmp_path), 0)


def test_a_parquet_row_past_the_limit_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "x" * (MAX_RECORD_BYTES + 5)], "n": [1, 2]}), tmp_path / "d.parquet")
    ds = ir.Dataset(name="d", format="parquet", path="d.parquet")
    with pytest.raises(ValueError, match=r"^d.parquet: row 2, field 'prompt': a record of 1,048,581 bytes"):
        load_dataset(ds, str(tmp_path), 0)


def test_an_sft_record_longer_than_the_context_is_refused_not_cut(tiny_model):
    from transformers import AutoTokenizer

    from askspec.runtime.train.stages import sft_trajectories

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    opts = {"data": "cold", "prompt": "prompt", "completion": "completion"}
    recs = [(0, {"prompt": "What is 1 + 1?", "completion": "2"}), (1, {"prompt": "word " * 400, "completion": "2"})]
    assert len(sft_trajectories(tok, None, 2, recs[:1], opts, 1, context=256)) == 1
    with pytest.raises(ValueError, match=r"record 2: [\d,]+ prompt \+ 2 completion tokens, more than the model's "
                                         r"context of 256"):
        sft_trajectories(tok, None, 2, recs, opts, 1, context=256)


@pytest.fixture(scope="module")
def huge_config(tmp_path_factory) -> Path:
    """A folder holding only the config of a ~400B-parameter Llama (no weights)."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("huge")
    LlamaConfig(vocab_size=128256, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                num_attention_heads=128, num_key_value_heads=8).save_pretrained(str(folder))
    return folder


def test_a_model_larger_than_memory_is_refused_before_loading(huge_config, tiny_model):
    from askspec.runtime.backends.hf import HFBackend, parameter_count

    assert parameter_count(huge_config) > 400e9
    with pytest.raises(BackendError, match=r"hf model '.*': [\d,]+ parameters × 4 bytes = [\d,.]+ GiB, more than "
                                           r"the [\d,.]+ GiB of memory available on the cpu"):
        HFBackend(str(huge_config), device="cpu").load()
    HFBackend(str(tiny_model), device="cpu").load()  # a model that fits loads as before


def test_a_trained_model_larger_than_memory_is_refused(huge_config):
    from askspec.runtime.train.config import config_from_ir
    from askspec.runtime.train.policy import TrainedPolicy

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {})
    with pytest.raises(BackendError, match=r"trained role 'r' .*parameters × 16 bytes"):
        TrainedPolicy(config_from_ir(exp.training[0], exp), str(huge_config), {"device": "cpu"})
