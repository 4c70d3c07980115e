"""The vocabulary (askspec/ir/vocab.py) is the one list of each kind: the IR's types, the
checker's tables and the runtime's dispatch tables hold exactly its names."""

from __future__ import annotations

import dataclasses
from typing import get_args

from askspec.ir import model as ir
from askspec.ir import vocab
from askspec.lang import training
from askspec.runtime.backends.base import Sampling
from askspec.runtime.backends.registry import BACKENDS as BACKEND_CLASSES
from askspec.runtime.replies.parsers import PARSERS as PARSER_FUNCTIONS


def test_the_ir_types_its_kinds_with_the_vocabulary():
    assert get_args(ir.Model.model_fields["backend"].annotation) == vocab.BACKENDS
    assert set(get_args(ir.ReplyParser.model_fields["kind"].annotation)) == set(vocab.PARSERS)
    assert get_args(ir.Stage.model_fields["kind"].annotation) == vocab.STAGE_KINDS


def test_the_runtime_dispatches_on_the_vocabulary():
    from askspec.ir.advantages import RAW, TEXT

    assert set(BACKEND_CLASSES) == set(vocab.BACKENDS)
    assert set(PARSER_FUNCTIONS) == set(vocab.PARSERS)
    assert set(RAW) == set(TEXT) == set(vocab.ESTIMATORS)
    assert {f.name for f in dataclasses.fields(Sampling)} == set(vocab.SAMPLING_FIELDS)


def test_every_algorithm_resolves_to_known_kinds():
    for algorithm, (estimator, loss, aggregation) in vocab.ALGORITHM_DEFAULTS.items():
        assert estimator is None or estimator in vocab.ESTIMATORS, algorithm
        assert loss in vocab.LOSSES and aggregation in vocab.AGGREGATIONS, algorithm
    assert set(training.ALGORITHM_ARGS) == vocab.ALGORITHMS
    assert training.HYPERPARAMETERS["aggregation"].choices == vocab.AGGREGATIONS
