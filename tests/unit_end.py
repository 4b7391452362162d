"""Ending what a unit of work started once its last test on this process is over.

A session fixture lives until the last test of the session; one that only a unit's tests use
(a Ray cluster of the ``ray`` group) would idle there for the rest of the run, spending CPU the
other tests want (an idle Ray head and node: ~2 s of CPU a minute).  ``at_unit_end(unit, stop)``
calls ``stop`` after the unit's last test on this process instead (``tests/conftest.py``'s
``pytest_runtest_teardown``; a unit's tests run one after another on one process).  The fixture
still stops it at the session's end too, for a run interrupted before the unit ended: ``stop`` must
do nothing the second time.
"""

from __future__ import annotations

from collections.abc import Callable

_STOPS: dict[str, list[Callable[[], None]]] = {}


def at_unit_end(unit: str, stop: Callable[[], None]) -> None:
    """Call ``stop`` once this process has run the last test of ``unit`` (a module path or a group)."""
    _STOPS.setdefault(unit, []).append(stop)


def end_unit(unit: str) -> None:
    """Call the stops registered for ``unit``, the last registered first."""
    for stop in reversed(_STOPS.pop(unit, [])):
        stop()

