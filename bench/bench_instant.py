"""The instant in-process model of the orchestration benchmark (a Python-backed role)."""


def reply(messages, request):
    return "#Answer# ok"
