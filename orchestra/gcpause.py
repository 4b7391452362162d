"""Pausing Python's cyclic garbage collector while a large, acyclic structure is built."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (as it was before afterwards).

    For code that allocates hundreds of thousands of objects that form no cycles (a plan of
    100,000 tasks, the rows of 316 dataset files): each full collection walks everything
    allocated so far, so a collector left on spends time that grows with the structure and
    frees nothing.  Reference counting still frees what is dropped.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@contextlib.contextmanager
def gc_frozen(build: Callable[[], T]) -> Iterator[T]:
    """``build()`` with the collector paused, then the block with everything alive kept out of
    the collector's sight; yields what ``build`` returned.

    For a large structure that lives through the block (a run's plan of 100,000 tasks, while its
    stages run): once the collector is on again, its first collections would walk all of it,
    generation after generation (seconds at that size, before the first task starts), and free
    nothing.  ``gc.freeze`` moves it to the permanent generation at no cost; ``gc.unfreeze`` hands
    it back at the block's end, so nothing stays out of the collector's reach for good.

    A process that froze objects of its own before (a program calling ``orchestra.run`` that
    freezes what it holds before it forks) keeps them frozen: ``gc.unfreeze`` cannot tell its
    objects from ours, so nothing is frozen then (the block runs with the collector as it was).
    """
    with gc_paused():
        value = build()
        ours = gc.get_freeze_count() == 0
        if ours:
            gc.freeze()  # still paused: the objects just made are frozen before any collection walks them
    try:
        yield value
    finally:
        if ours:
            gc.unfreeze()
