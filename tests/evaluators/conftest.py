"""Each evaluator test gets the sandbox scope of its own lock folder (scopes are cached by name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestra.limits.concurrency import drop_scope
from orchestra.sandbox.process import SCOPE_NAME


@pytest.fixture(autouse=True)
def _fresh_sandbox_scope() -> Iterator[None]:
    drop_scope(SCOPE_NAME, host_wide=True)
    yield
    drop_scope(SCOPE_NAME, host_wide=True)
