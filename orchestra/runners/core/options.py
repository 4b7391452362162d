"""The loop's options, declared once for every runner: what ``**loop`` of a runner's constructor
takes, what ``BaseRunner`` documents, and what the config check reads (``config/schema.py``)."""

from __future__ import annotations

from typing import TypedDict, TypeVar


class LoopOptions(TypedDict, total=False):
    """The loop's options, the same keys for every runner (``BaseRunner``'s Args say what each
    means).  A runner takes them as ``**loop: Unpack[...]`` and passes them on once; the config
    check reads the keys from here (``config/schema.py``)."""

    max_num_workers: int | None
    retry: int
    retry_backoff_s: float
    timeout_s: float | None
    poll_interval_s: float | None
    infra_retry: int


class CommandLoopOptions(LoopOptions, total=False):
    """``LoopOptions`` and ``template``: for a runner whose attempts are commands (all but Ray's
    actors)."""

    template: str | list[str] | None


Options = TypeVar("Options", bound=LoopOptions)


def with_defaults(given: Options, defaults: LoopOptions) -> Options:
    """``given`` with a runner's ``loop_defaults`` filled in where a key is missing or None."""
    merged = given.copy()
    for key, value in defaults.items():
        if merged.get(key) is None:
            merged[key] = value  # type: ignore[literal-required]
    return merged
