"""Issue #35 item 3: `askspec run`'s closing summary puts what each role spent beside the
estimate's bounds (runtime/commands/estimate.py) of the sessions the run played, with
tokens counted by a real server (the loopback OpenAI-compatible test server)."""

from __future__ import annotations

import asyncio
import re

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

from fake_openai_server import FakeOpenAIServer

SPEC = """
model m = openai("served") { max_tokens = 12 }
role asker { model = m; memory = none }
role checker { model = m; memory = none; max_tokens = 5 }
game g for i in range(0, 3) {
    q = ask asker using "question {{ i }}"
    if i > 0 { c = ask checker using "check {{ q.text }}" }
    reward asker = 1.0
}
"""


def test_the_closing_summary_compares_what_each_role_spent_with_the_estimate(tmp_path, capsys):
    spec = tmp_path / "s.ask"
    spec.write_text(SPEC)

    async def go():
        async with FakeOpenAIServer() as server:
            return await run_spec(str(spec), out=str(tmp_path / "runs"), quiet=False, base_url=server.base_url)

    rc, run_dir = asyncio.run(go())
    assert rc == 0
    err = capsys.readouterr().err
    spent = dict(((role, (n, tin, tout)) for role, n, tin, tout in open_store(run_dir).execute(
        "select role, count(*), sum(tokens_in), sum(tokens_out) from turns group by role").fetchall()))
    assert spent["asker"][0] == 3 and spent["checker"][0] == 2
    lines = err[err.index("  spent vs the estimate's bounds of these sessions"):].splitlines()
    # the bounds: 3 sessions x 1 ask of 12 tokens; the checker's `if` may ask in every session (3 x 5)
    assert lines[1] == (f"    asker: calls 3 of ≤ 3, prompt {spent['asker'][1]} (no bound), "
                        f"completion {spent['asker'][2]} of ≤ 36 tokens")
    assert lines[2] == (f"    checker: calls 2 of ≤ 3, prompt {spent['checker'][1]} (no bound), "
                        f"completion {spent['checker'][2]} of ≤ 15 tokens")
    assert re.match(r"  run directory: ", lines[3])
