"""Import the test server by path (tests/ is not a package), for conftest files and tests."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

SERVER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_server.py")


def load_server_module() -> ModuleType:
    name = "orchestra_test_openai_server"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SERVER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load(name: str, file: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(SERVER_PATH), file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_batch_server_module() -> ModuleType:
    """The OpenAI Files + Batches double (tests/servers/openai_batch_server.py)."""
    return _load("orchestra_test_openai_batch_server", "openai_batch_server.py")


def load_anthropic_server_module() -> ModuleType:
    """The Anthropic Messages + Message Batches double (tests/servers/anthropic_server.py)."""
    return _load("orchestra_test_anthropic_server", "anthropic_server.py")
