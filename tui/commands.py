"""Command palette (ctrl+p) entries: open any run, plus the current screen's actions.

A run's id and experiment are data: the palette reads a string as markup, so they go in
as ``Text`` or escaped."""

from __future__ import annotations

from functools import partial

from rich.text import Text
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.fuzzy import Matcher
from textual.markup import escape

from askspec.terminal import printable
from askspec.tui.messages import OpenRun


def _highlight(matcher: Matcher, label: str) -> Content:
    """``label`` with the query's letters marked (``Matcher.highlight`` reads its
    argument as markup, and a run id may hold ``[``)."""
    content = Content(label)
    score, offsets = matcher.fuzzy_search.match(matcher.query, label)
    for offset in offsets if score else ():
        if not label[offset].isspace():
            content = content.stylize(matcher.match_style, offset, offset + 1)
    return content


class RunsProvider(Provider):
    """``open run <id>`` for every run the runs screen has listed."""

    def _commands(self) -> list[tuple[str, str, OpenRun]]:
        out = []
        for r in getattr(self.app, "known_runs", []):
            label = f"open run {printable(r.run_id, single_line=True)}"
            help_ = f"{r.experiment or '?'}  {r.status or '?'}  sessions {r.done}/{r.planned}"
            out.append((label, help_, OpenRun(r.run_id)))
        return out

    async def discover(self) -> Hits:
        for label, help_, msg in self._commands():
            yield DiscoveryHit(Text(label), partial(self.app.post_message, msg), help=escape(help_))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_, msg in self._commands():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, _highlight(matcher, label), partial(self.app.post_message, msg), help=escape(help_))
