"""askspec.tui: the Textual terminal UI.

Installs as ``askspec.tui``; imported under another name it fails loudly (see
``askspec.runtime``)."""

if __name__ != "askspec.tui":
    raise ImportError(f"the TUI is imported as '{__name__}'; import it as 'askspec.tui'")
