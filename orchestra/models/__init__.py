"""Models the inference engine can call.

Importing this package must stay cheap: heavy model classes are loaded on first use, by
name, so that the orchestrator never imports an ML framework.
"""

from __future__ import annotations

from typing import Any

from orchestra.models.base import BaseModel, BatchedModel
from orchestra.models.fake import DeterministicModel
from orchestra.requests import GenRequest, LoglikRequest

_LAZY = {
    "HFCausalLM": "orchestra.models.hf",
    "VLLMModel": "orchestra.models.vllm",
    "OpenAIAPI": "orchestra.models.openai_api",
    "AnthropicAPI": "orchestra.models.anthropic_api",
}

__all__ = ["BaseModel", "BatchedModel", "DeterministicModel", "GenRequest", "LoglikRequest", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchestra.models' has no attribute {name!r}")
