"""Compare runs sample by sample: ``orchestra compare RUN_A RUN_B ...`` and ``orchestra.compare(...)``.

::

    import orchestra
    cmp = orchestra.compare(["outputs/demo/20261128_101500", "outputs/demo/20261128_121500"])
    for t in cmp.tests:                       # one per (dataset, model, metric) and later run
        print(t.dataset, t.metric, t.a.value, t.b.value, t.paired.diff, t.paired.ci, t.paired.p_holm)
    cmp.to_json()                             # what `orchestra compare --json` prints

Samples are aligned by their key (the content of their row), tested in pairs with
:mod:`orchestra.stats`; see docs/statistics.md, "Comparing runs".  ``orchestra.compare`` is
this package's :func:`compare`.
"""

from __future__ import annotations

from orchestra.comparison.align import Comparison, Flip, Test, compare

__all__ = ["Comparison", "Flip", "Test", "compare"]

