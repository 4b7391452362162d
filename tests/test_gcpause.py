"""``gc_frozen``: a run's plan kept out of the cyclic collector's passes while the stages run
(issue 40: at 200,000 tasks the first collections after planning walked it for ~0.3-3 s before
the first task started)."""

from __future__ import annotations

import gc

from orchestra.gcpause import gc_frozen


def test_what_is_built_is_frozen_for_the_block_and_handed_back_after() -> None:
    assert gc.get_freeze_count() == 0
    collected: list[bool] = []

    def build() -> list[list[int]]:
        collected.append(gc.isenabled())
        return [[i] for i in range(5000)]

    with gc_frozen(build) as plan:
        assert collected == [False]  # built with the collector paused
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(plan)
        assert not any(obj is plan for obj in gc.get_objects())  # in no generation a collection walks
    assert gc.get_freeze_count() == 0
    assert any(obj is plan for obj in gc.get_objects())  # the collector's again
    assert len(plan) == 5000
