"""The sessions table's column chooser: a list of its columns to show or hide, and the
token columns (tokens in and out per role, read from the turns) to add."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import SelectionList, Static
from textual.widgets.selection_list import Selection

from askspec.terminal import printable
from askspec.tui.columns import KEY_COLUMN, ColumnChoice
from askspec.tui.components.guard import Guarded

TOKENS = "\0tokens"  # the chooser's entry for the token columns (no column has this name)


class ColumnsScreen(Guarded, ModalScreen[ColumnChoice | None]):
    """Dismissed with the new choice (Enter), or None (Escape)."""

    DEFAULT_CSS = """
    ColumnsScreen { align: center middle; }
    ColumnsScreen > Vertical { width: 60; max-height: 80%; height: auto; border: round $primary;
                               background: $surface; padding: 0 1; }
    ColumnsScreen SelectionList { height: auto; max-height: 30; }
    """
    BINDINGS = [Binding("enter", "apply", "Apply", priority=True), Binding("escape", "cancel", "Cancel")]

    def __init__(self, columns: list[str], choice: ColumnChoice, experiment: str | None,
                 token_columns: frozenset[str] = frozenset()) -> None:
        super().__init__()
        # (the token columns come and go together, with their own entry)
        self.columns = [c for c in columns if c != KEY_COLUMN and c not in token_columns]
        self.choice = choice
        self.experiment = experiment

    def compose(self) -> ComposeResult:
        with Vertical():
            title = Text("Columns", style="bold")
            title.append(f" of {printable(self.experiment or 'this spec', single_line=True)}'s runs"
                         "  (space: show/hide · enter: apply · esc: cancel)", style="")
            yield Static(title)
            items = [Selection(Text(printable(c, single_line=True)), c, c not in self.choice.hidden)
                     for c in self.columns]
            items.append(Selection(Text("tokens in / out per role (reads the turns)"), TOKENS, self.choice.tokens))
            yield SelectionList[str](*items, id="column-list")

    def on_mount(self) -> None:
        self.query_one("#column-list").focus()

    def action_apply(self) -> None:
        chosen = set(self.query_one("#column-list", SelectionList).selected)
        hidden = {c for c in self.columns if c not in chosen}
        # columns of this spec not in this run (another run's variables) stay as they were
        hidden |= {c for c in self.choice.hidden if c not in self.columns}
        self.dismiss(ColumnChoice(hidden=hidden, tokens=TOKENS in chosen))

    def action_cancel(self) -> None:
        self.dismiss(None)
