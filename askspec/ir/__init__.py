"""The game-graph IR: typed pydantic models, canonical JSON, content hash, renderers."""
