"""Reusable widgets of the TUI, one per module: ``table`` (an Arrow-backed virtual
table), ``transcript_view`` (a transcript's turns, Line API), ``turn`` (one transcript
turn as text, wrapped in the worker), ``heatmap``, ``loader`` (the worker mixin)."""
