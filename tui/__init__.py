"""askspec.tui: the Textual terminal UI."""
