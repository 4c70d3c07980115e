"""Session engine: plays sessions over the game-graph IR.

- ``plan``      the IR's games -> session plans (elements, bindings, seeds)
- ``session``   ``Engine``: the async interpreter of one session's steps
- ``evaluator`` the spec's expression language over a session's values
- ``routing``   group routes (keep / drop / judge / tournament)
- ``stateful``  functions with state across sessions (diversity, novelty histories)
- ``resume``    rebuilding finished sessions from a run store
- ``metrics``   the spec's metric declarations over recorded sessions

Nothing is imported here: each stage module is imported by name.
"""
