"""A deliberately slow Python-backed model for the kill/resume test (named in its spec)."""

import asyncio


async def reply(messages, request):
    await asyncio.sleep(0.15)
    return f"#Question# what is {request.session_index}+1? \\boxed{{{request.session_index + 1}}}"
