"""The ``runs`` fixture: run A and run B with planted differences (planted.py), made once per module."""

from __future__ import annotations

import pytest
from planted import Runs, make_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory.mktemp("compare"))
