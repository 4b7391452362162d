"""An lm-eval task name that lm-eval does not know, refused with the names it most likely meant.

lm-eval itself answers a misspelt ``--tasks arc_chalenge`` with a ``KeyError`` that lists
nothing.  The planning probe asks :func:`check_known` first: a name that is neither in lm-eval's
task index (its stock tasks, groups and tags, and those of ``include_path``) nor a path is a
``ConfigError`` naming the closest names of that index (:func:`difflib.get_close_matches`).
Runs where ``lm_eval`` is imported (the probe), never in the orchestrator.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from orchestra.errors import ConfigError

#: the suggestions a message lists at most
MAX_SUGGESTIONS = 5


def closest(name: str, known: list[str], n: int = MAX_SUGGESTIONS) -> list[str]:
    """The names of ``known`` closest to ``name``, best first (case ignored; ``[]`` when none is close)."""
    lowered: dict[str, str] = {}
    for k in known:
        lowered.setdefault(k.lower(), k)
    return [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)]


def check_known(name: str, tm: Any) -> None:
    """``ConfigError`` when lm-eval's task manager ``tm`` cannot resolve ``name`` (not in its
    index and not a path), naming the closest indexed names."""
    known = list(tm.all_tasks)
    if name in known or os.path.exists(name):  # a path: lm-eval reads the YAML there itself
        return
    near = closest(name, known)
    hint = (f"closest names: {', '.join(near)}" if near
            else "list them with `lm_eval --tasks list` (include_path's tasks included)")
    raise ConfigError(f"task={name!r} is not an lm-eval task, group or tag; {hint}")
