"""Session engine: plays sessions over the game-graph IR.

- ``plan``      the IR's games -> session plans (elements, bindings, seeds)
- ``session``   ``Engine``: the async interpreter of one session's steps
- ``state``     typed records: a running session, its bookkeeping, a finished session
- ``calls``     one model call: sampling, seed, backend request, the recorded turn
- ``evaluator`` the spec's expression language over a session's values
- ``routing``   group routes (keep / drop / judge / tournament) behind a judge client
- ``judges``    the engine's judge client (judge calls recorded as turns)
- ``stateful``  functions with state across sessions (diversity, novelty histories)
- ``recorder``  the events the engine records (the run store's writer is the real one)
- ``resume``    rebuilding finished sessions from a run store
- ``metrics``   the spec's metric declarations over recorded sessions

Nothing is imported here: each stage module is imported by name.
"""
