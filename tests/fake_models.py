"""Python-backed fake models used by the engine tests (named as fakes; opt-in via spec)."""

import asyncio
import json

IN_FLIGHT = {"now": 0, "max": 0}


def count_messages(messages, request):
    """Replies with how many messages it was sent and the roles of each."""
    return json.dumps({"n": len(messages), "roles": [m["role"] for m in messages], "call": request.call_index})


async def slow_tracked(messages, request):
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
    await asyncio.sleep(0.02)
    IN_FLIGHT["now"] -= 1
    return f"#Answer# {request.role}-{request.call_index}"


def session_answer(messages, request):
    """Answers \\boxed{k} where k is the session index modulo 2 (for diverse groups)."""
    return f"I think \\boxed{{{request.session_index % 2}}}"


def always_one(messages, request):
    return "\\boxed{1}"


def judge_first(messages, request):
    """A judge that always prefers the response shown first."""
    return "Response A is better. \\boxed{A}"


def fails(messages, request):
    raise RuntimeError("the fake model is down")


UNIVERSAL = (
    "#Reasoning# short plan #Draft# 1+1=2 \\boxed{2} #Question# What is 1+1?\n"
    "<problem>What is 1+1?</problem> <answer>\\boxed{2}</answer>\n"
    "<question>What is 1+1?</question>\n"
    "#Summary# \\boxed{2} I added the numbers.\n"
    '{"is_final_answer": true, "is_correct": true, "all_rubric_criteria_resolved": true, '
    '"missing_rubric_criteria": [], "notes": "fine", "rubric_items_cleared": 1}\n'
    "Final answer: \\boxed{2}"
)


def universal(messages, request):
    """One reply every parser in the five specs accepts (tags, sections, JSON, boxed)."""
    return UNIVERSAL


def seeded(messages, request):
    """Echoes the sampling seed the engine chose for this call (determinism tests)."""
    return f"#Answer# seed={request.sampling.seed} call={request.call_index}"


async def jittery(messages, request):
    """Finishes out of session order (a deterministic per-session delay) with texts that
    overlap partly across sessions, for history-dependent rewards."""
    await asyncio.sleep(((request.session_index * 7) % 11) * 0.01)
    return "#Question# q"


def judge_rambles(messages, request):
    """A judge that never ends with a verdict in a box (as a small model often does)."""
    return "Both responses have merit; it is hard to say which one is better."


def judge_fails_later(messages, request):
    """Gives verdicts for the first group (session index 0) only, then rambles."""
    return "\\boxed{A}" if request.session_index == 0 else judge_rambles(messages, request)


def blocking(messages, request):
    """A synchronous callable that holds the event loop for a moment on every call."""
    import time

    time.sleep(0.003)
    return f"#Answer# {request.session_index}"


def exits(messages, request):
    """A callable that calls sys.exit() (a BaseException, not an error of the session)."""
    if request.session_index == 2:
        raise SystemExit(3)
    return "fine"


def generator_exit(messages, request):
    if request.session_index == 2:
        raise GeneratorExit
    return "fine"


def interrupts(messages, request):
    """KeyboardInterrupt raised from inside a callable (as Ctrl-C in its code would)."""
    if request.session_index == 2:
        raise KeyboardInterrupt
    return "fine"


def with_ttft(messages, request):
    """A reply whose result says when its first token came (as the hf backend's does)."""
    from askspec.runtime.backends.base import ChatResult

    return ChatResult(text="#Answer# ok", tokens_in=4, tokens_out=2, latency_ms=9.0, ttft_ms=7.5)


async def finishes_backwards(messages, request):
    """Answers later the earlier it was asked: role `a` after `b`, and of one role's calls
    the first last (turn numbering must not follow the order replies arrive in)."""
    delay = (0.06 if request.role == "a" else 0.0) + (3 - request.call_index % 4) * 0.01
    await asyncio.sleep(delay)
    return f"#Answer# {request.role}-{request.call_index}"


def boxed_on_second_try(messages, request):
    """No \\boxed{} until it has been asked again (a recovery turn sees 3+ messages)."""
    return "the answer is 7" if len(messages) < 3 else "so \\boxed{7}"


def budget_echo(messages, request):
    """Echoes the call's sampling budget and temperature, without the `#Answer#` tag (so
    a role that requires it sends its recovery turn)."""
    s = request.sampling
    return f"max_tokens={s.max_tokens} temperature={s.temperature} stop={list(s.stop)}"


SEEN: list = []


def remember_messages(messages, request):
    """Replies "ROLE CALL" (e.g. "pro 0") and keeps what each call was sent in SEEN as
    (role, call index, [(message role, content), ...])."""
    SEEN.append((request.role, request.call_index, [(m["role"], m["content"]) for m in messages]))
    return f"{request.role} {request.call_index}"


def final_answer_on_second_try(messages, request):
    """No `#Final_Answer#` section until it has been asked again (a recovery turn sees 3+
    messages): a section tag whose field name keeps its underscore (`final_answer`)."""
    if len(messages) < 3:
        return "#Reasoning#\n3 and 4 make 7, I think."
    return "#Reasoning#\n3 + 4 = 7\n#Final_Answer#\n7"


def echo_user(messages, request):
    """Replies with the last user message (which data a session was given)."""
    return messages[-1]["content"]
