"""``Guarded``: a message pump (the app, a screen, a widget) whose handlers' exceptions
go to the app's error panel instead of ending its message loop.

Textual hands an exception escaping a handler to ``App._handle_exception`` and stops
that pump's loop: the widget (or the whole app) would never handle another key or
message. Here the loop goes on; the app (``AskspecApp._handle_exception``) logs the
error and shows it."""

from __future__ import annotations

from textual.message import Message


class Guarded:
    """Mixin, before the Textual class: ``class RunsScreen(Guarded, Screen)``."""

    async def _dispatch_message(self, message: Message) -> None:
        try:
            await super()._dispatch_message(message)  # type: ignore[misc]
        except Exception as error:
            self.app._handle_exception(error)  # type: ignore[attr-defined]
