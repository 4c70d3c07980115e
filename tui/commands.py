"""Command palette (ctrl+p) entries: open any run, plus the current screen's actions."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from askspec.terminal import printable
from askspec.tui.messages import OpenRun


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
            yield DiscoveryHit(label, partial(self.app.post_message, msg), help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_, msg in self._commands():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self.app.post_message, msg), help=help_)
