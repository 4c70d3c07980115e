"""base.direct_init and base.reseeded build the same frozen instances as dataclasses does."""

from __future__ import annotations

import dataclasses

import pytest

from askspec.runtime.backends.base import ChatRequest, ChatResult, Sampling, direct_init, reseeded


@dataclasses.dataclass(frozen=True)
class _Plain:
    a: int
    b: str = "x"
    c: list = dataclasses.field(default_factory=list)
    d: float | None = None


@direct_init
@dataclasses.dataclass(frozen=True)
class _Fast:
    a: int
    b: str = "x"
    c: list = dataclasses.field(default_factory=list)
    d: float | None = None


@pytest.mark.parametrize("args,kwargs", [((1,), {}), ((1, "y"), {}), ((2,), {"d": 0.5}), ((3, "z", [1]), {"d": None})])
def test_direct_init_matches_the_dataclass_init(args, kwargs):
    plain, fast = _Plain(*args, **kwargs), _Fast(*args, **kwargs)
    assert dataclasses.astuple(plain) == dataclasses.astuple(fast)
    assert list(vars(fast)) == [f.name for f in dataclasses.fields(_Fast)]  # field order kept (repr, asdict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.a = 5  # type: ignore[misc]


def test_direct_init_default_factory_is_fresh_and_signature_checked():
    x, y = _Fast(1), _Fast(2)
    assert x.c == [] and x.c is not y.c
    with pytest.raises(TypeError):
        _Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Fast(1, e=2)  # type: ignore[call-arg]


def test_request_result_sampling_as_before():
    s = Sampling(temperature=0.5, max_tokens=9, stop=("x",), seed=4)
    assert repr(s) == ("Sampling(temperature=0.5, top_p=None, top_k=None, min_p=None, presence_penalty=None, "
                       "repetition_penalty=None, max_tokens=9, stop=('x',), seed=4)")
    req = ChatRequest(messages=({"role": "user", "content": "hi"},), sampling=s, role="r")
    assert req.options == {} and req.options is not ChatRequest(messages=()).options
    assert ChatResult("t").finish_reason == "stop"


@pytest.mark.parametrize("seed", [None, 0, 123456789])
def test_reseeded_is_replace(seed):
    template = Sampling(temperature=0.7, top_p=0.9, max_tokens=64, stop=("a", "b"))
    got = reseeded(template, seed)
    assert got == dataclasses.replace(template, seed=seed)
    assert repr(got) == repr(dataclasses.replace(template, seed=seed))
    assert template.seed is None  # the template is left as it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.seed = 1  # type: ignore[misc]
