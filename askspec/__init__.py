"""askspec: a declarative experiment-spec compiler for multi-model LLM games."""
__version__ = "0.1.0"
