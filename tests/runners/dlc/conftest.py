"""A fresh DLC double (tests/dlc/bin/dlc) per test, on PATH, cleaned up after it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dlc_helpers import BIN, Double


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Double]:
    """The double's cloud in ``tmp_path / 'cloud'``, its ``dlc`` first on PATH for this process."""
    cloud = Double(tmp_path / "cloud")
    monkeypatch.setenv("FAKE_DLC_STATE", str(cloud.state))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    yield cloud
    cloud.kill_all()
