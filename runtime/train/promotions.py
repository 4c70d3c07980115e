"""The promoted datasets a nested schedule's retrain stage trains on, as the inner-loop
service records them (its state file, ``STATE``: the outer step last answered and its
answer). The service writes it (runtime/targets/openrlhf/inner_loop.py); `askspec run
--stage NAME --promotions FILE` and a job's retrain.sh read it here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATE = "state.json"  # the outer step last answered and its answer


def read_promotions(path: str | Path) -> list[dict[str, Any]]:
    """The promoted datasets in a service's state file (STATE: its last answer's
    `promotions`, each {step, dataset, copy, items}), which a retrain stage on promoted
    datasets trains on (`askspec run --stage NAME --promotions FILE`, the job's retrain.sh)."""
    from askspec.lang.paths import MAX_STATE_BYTES, FileRefused, read_regular

    try:
        state = json.loads(read_regular(path, MAX_STATE_BYTES).decode("utf-8"))
    except FileRefused as e:  # a device, a FIFO, a folder, or past the limit
        raise ValueError(f"{e} (the inner-loop service's state file: the job's $ASKSPEC_INNER_STATE/{STATE})") from None
    except OSError as e:
        raise ValueError(f"cannot read the inner-loop service's state file {path}: {e.strerror or e} (the job's "
                         f"$ASKSPEC_INNER_STATE/{STATE}, written once the service has answered an outer step)") from None
    except RecursionError:
        raise ValueError(f"{path} is not the inner-loop service's state file (JSON nested too deeply)") from None
    except ValueError as e:
        raise ValueError(f"{path} is not the inner-loop service's state file (not JSON: {e})") from None
    promotions = (state.get("answer") or {}).get("promotions") if isinstance(state, dict) else None
    if not isinstance(promotions, list) or not all(isinstance(p, dict) and isinstance(p.get("items"), list)
                                                   for p in promotions):
        raise ValueError(f"{path} is not the inner-loop service's state file: it has no answer.promotions, a list of "
                         f"{{step, dataset, copy, items}} (the service's $ASKSPEC_INNER_STATE/{STATE})")
    return promotions
