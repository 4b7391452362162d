"""Prices: the config's optional ``prices`` table turns tokens, requests and GPU time into money.

.. code-block:: python

    prices = {
        'gpt-mini': dict(input_per_1m_tokens=0.15, output_per_1m_tokens=0.60),
        'llama-70b': dict(per_gpu_hour=2.5, currency='EUR'),
    }

Keys are model abbrs; every price is optional and defaults to 0; ``currency`` defaults to USD.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from orchestra.errors import ConfigError, check_known_keys
from orchestra.fileio import atomic_write_json
from orchestra.paths import RunPaths
from orchestra.summary.runlog import ModelUsage

PRICE_KEYS = ("input_per_1m_tokens", "output_per_1m_tokens", "per_request", "per_gpu_hour", "currency")


def check_prices(prices: Any, models: list[str], where: str) -> dict[str, dict[str, Any]]:
    """The validated price table (``ConfigError`` naming the key for anything wrong)."""
    if prices is None:
        return {}
    if not isinstance(prices, dict):
        raise ConfigError(f"{where}: prices must be a dict of model abbr -> dict(input_per_1m_tokens=..., "
                          f"output_per_1m_tokens=...), got {type(prices).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for abbr, entry in prices.items():
        if abbr not in models:
            raise ConfigError(f"{where}: prices: no model has abbr {abbr!r}; models: {', '.join(models)}")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: prices.{abbr}: expected a dict with {', '.join(PRICE_KEYS)}, got {entry!r}")
        check_known_keys(entry, PRICE_KEYS, f"{where}: prices.{abbr}")
        for key, value in entry.items():
            if key == "currency":
                if not isinstance(value, str) or not value:
                    raise ConfigError(f"{where}: prices.{abbr}.currency: expected a name such as 'USD', got {value!r}")
            elif (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                  or not math.isfinite(value)):
                raise ConfigError(f"{where}: prices.{abbr}.{key}: expected a number >= 0, got {value!r}")
        out[abbr] = {"currency": "USD", **entry}
    return out


def cost_of(usage: ModelUsage, price: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{"amount", "currency", "partial"}`` for one model, or None without a price.
    ``partial``: a token price is set but the model did not report its tokens."""
    if not price:
        return None
    amount = usage.requests * float(price.get("per_request", 0))
    amount += usage.gpu_s / 3600 * float(price.get("per_gpu_hour", 0))
    partial = False
    for tokens, key in ((usage.prompt_tokens, "input_per_1m_tokens"),
                        (usage.completion_tokens, "output_per_1m_tokens")):
        rate = float(price.get(key, 0))
        if rate and tokens is None:
            partial = True
        amount += (tokens or 0) / 1e6 * rate
    return {"amount": amount, "currency": price.get("currency", "USD"), "partial": partial}


def _prices_path(paths: RunPaths) -> str:
    return os.path.join(paths.summary_dir, "prices.json")


def save_prices(paths: RunPaths, prices: dict[str, dict[str, Any]]) -> None:
    """Keep the run's price table beside its summary (the saved config leaves it out)."""
    atomic_write_json(_prices_path(paths), prices)


def load_prices(paths: RunPaths) -> dict[str, dict[str, Any]]:
    """The price table an earlier invocation saved, or ``{}``."""
    try:
        with open(_prices_path(paths), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
