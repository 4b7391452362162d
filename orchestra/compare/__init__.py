"""Compare runs sample by sample: ``orchestra compare RUN_A RUN_B ...`` and ``orchestra.compare(...)``.

::

    import orchestra
    cmp = orchestra.compare(["outputs/demo/20261128_101500", "outputs/demo/20261128_121500"])
    for t in cmp.tests:                       # one per (dataset, model, metric) and later run
        print(t.dataset, t.metric, t.a.value, t.b.value, t.paired.diff, t.paired.ci, t.paired.p_holm)
    cmp.to_json()                             # what `orchestra compare --json` prints

Samples are aligned by their key (the content of their row), tested in pairs with
:mod:`orchestra.stats`; see docs/statistics.md, "Comparing runs".  The package is callable
(``orchestra.compare(runs, ...)`` is :func:`compare`), so that the function and the package
keep one name.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from orchestra.compare.align import Comparison, Flip, Test, compare

__all__ = ["Comparison", "Flip", "Test", "compare"]


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`compare` (``orchestra.compare(...)``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Comparison:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
