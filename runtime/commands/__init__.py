"""The command layer: ``askspec run | metrics | query | runs | export | compact``.

Wiring only: each module parses its flags and calls the engine, the store or a backend.
"""
