"""Reusable widgets of the TUI, one per module: ``table`` (an Arrow-backed virtual
table), ``turn`` (one transcript turn), ``heatmap``, ``loader`` (the worker mixin)."""
