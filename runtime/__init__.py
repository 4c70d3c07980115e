"""askspec.runtime: executes the game-graph IR (engine, backends, parsers, scoring, store)."""
