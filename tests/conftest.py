"""Fixtures shared by the whole test tree."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

_LOADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "servers", "loader.py")


def _server_module() -> Any:
    spec = importlib.util.spec_from_file_location("orchestra_test_server_loader", _LOADER)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return loader.load_server_module()


@pytest.fixture
def server() -> Iterator[Any]:
    """A real OpenAI-compatible server on 127.0.0.1 (its own thread and event loop)."""
    with _server_module().ServerThread() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host-wide connection slots of each test in its own folder: tests never share them."""
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))


def _loader() -> Any:
    spec = importlib.util.spec_from_file_location("orchestra_test_server_loader", _LOADER)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return loader


@pytest.fixture
def batch_server() -> Iterator[Any]:
    """A double of OpenAI's Files + Batches API on 127.0.0.1 (tests/servers/openai_batch_server.py)."""
    with _loader().load_batch_server_module().BatchServerThread() as srv:
        yield srv


@pytest.fixture
def anthropic_server() -> Iterator[Any]:
    """A double of Anthropic's Messages + Message Batches API on 127.0.0.1 (tests/servers/anthropic_server.py)."""
    with _loader().load_anthropic_server_module().AnthropicServerThread() as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (``tests/report/chromium.py``) for the tests that open a page in it;
    a missing one fails the test with the command that installs it."""
    from tests.report.chromium import Chromium, ChromiumMissing

    try:
        chrome = Chromium()
    except ChromiumMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield chrome
    finally:
        chrome.close()
