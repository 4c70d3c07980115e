"""askspec.runtime: executes the game-graph IR.

Stage folders, each above the ones it uses:

- ``engine/``   plays sessions over the IR (plan, session engine, evaluator, routing, resume)
- ``replies/``  reply text -> fields (parsers), answer equivalence (verify)
- ``backends/`` hf, openai, vllm, python, replay behind one small interface
- ``scoring/``  rewards, tournaments, Bradley-Terry, diversity, buffers
- ``store/``    run directories, the writer, DuckDB views
- ``commands/`` ``askspec run | metrics | query | ...``: wiring only

This folder installs as ``askspec.runtime``; imported under any other name (``import
runtime`` from the repository root) it would be a second copy of every class, so that
fails loudly instead.
"""

if __name__ != "askspec.runtime":
    raise ImportError(
        f"the runtime is imported as '{__name__}'; import it as 'askspec.runtime' "
        "(install askspec with `pip install -e .`)"
    )
