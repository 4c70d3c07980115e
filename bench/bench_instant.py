"""The instant in-process model of the orchestration benchmark (a Python-backed role)."""


def reply(messages, request):
    return "#Answer# ok"


async def reply_async(messages, request):
    """The same model as an async callable: it runs on the event loop, with no thread hop."""
    return "#Answer# ok"
