"""What the planner needs to know about a dataset, cached by a content key.

Counting rows means reading a dataset once; the answer is kept in
``<cache>/dataset_info.json`` under a key that changes with the file's path, size, mtime
and reader settings, so later runs plan without loading anything.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from filelock import FileLock

from orchestra.datasets.base import BaseDataset, build_dataset, parse_range
from orchestra.datasets.digest import batched_stores, cache_dir, persist_digests
from orchestra.errors import ConfigError
from orchestra.fileio import atomic_write_json
from orchestra.gcpause import gc_paused
from orchestra.privdir import private_cache_dir


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset's config and the facts the planner uses: size, kind, choices per row."""

    cfg: dict[str, Any]
    abbr: str
    size: int
    kind: str  # inferencer type: gen | loglik | chat
    num_choices: float
    content_key: str


_PROBED: dict[tuple[int, str], dict[str, Any]] = {}


def _probe(ds: BaseDataset) -> dict[str, Any]:
    """Row count, columns and choices per row; computed once per rows list and inferencer
    (datasets slicing one file share its rows, see :func:`~orchestra.datasets.digest.shared_rows`,
    and are probed once).  The rows stay alive with their dataset, so their id is stable."""
    rows = ds.all_rows()
    key = (id(rows), json.dumps(ds.inferencer, sort_keys=True, default=str))
    if key not in _PROBED:
        _PROBED[key] = _count(rows, ds.inferencer)
    return _PROBED[key]


def _count(rows: list[dict[str, Any]], inf: dict[str, Any]) -> dict[str, Any]:
    choices = 0.0
    if inf.get("type") == "loglik":
        col = inf.get("choices_column")
        if col and rows and col in rows[0]:
            # an estimate of cost: a cell that is not a list counts one (its task says what is wrong)
            choices = sum(len(r[col]) if isinstance(r[col], (list, tuple)) else 1 for r in rows) / len(rows)
        else:
            choices = float(len(inf.get("choices") or [])) or 1.0
    # Columns every row has; a column some row lacks is remembered with that row, so a
    # config that needs it fails now, naming the row, and not inside a task.
    common = set(rows[0].keys()) if rows else set()
    partial: dict[str, int] = {}
    first = rows[0].keys() if rows else common
    if not all(row.keys() == first for row in rows):  # the usual file: every row has the same keys
        for n, row in enumerate(rows):
            for col in common - row.keys():
                partial[col] = n
            common &= row.keys()
    return {"num_rows": len(rows), "columns": sorted(common), "partial": partial, "num_choices": choices}


def _usable(facts: Any) -> bool:
    """Whether a size-cache entry has the shape :func:`_count` writes."""
    if not isinstance(facts, dict):
        return False
    rows, columns, partial = facts.get("num_rows"), facts.get("columns"), facts.get("partial", {})
    return (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0
            and isinstance(columns, list) and all(isinstance(c, str) for c in columns)
            and isinstance(partial, dict) and all(isinstance(v, int) for v in partial.values())
            and isinstance(facts.get("num_choices"), (int, float)))


def dataset_infos(cfgs: list[dict[str, Any]], where: str, write_cache: bool = True) -> list[DatasetInfo]:
    """Facts about every dataset; reads only those the cache does not know (with the cyclic
    garbage collector paused: rows hold no cycles, and 316,000 of them read for a sweep made
    its full passes cost a fifth of the reading)."""
    with gc_paused(), batched_stores():
        return _dataset_infos(cfgs, where, write_cache)


def _dataset_infos(cfgs: list[dict[str, Any]], where: str, write_cache: bool) -> list[DatasetInfo]:
    path = os.path.join(cache_dir(), "dataset_info.json")
    persist_digests(write_cache)
    try:
        with open(path, encoding="utf-8") as f:
            cache: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        cache = {}
    built = _plan_together(cfgs, lambda key: _usable(cache.get(key)))
    infos: list[DatasetInfo] = []
    fresh: dict[str, Any] = {}
    for i, cfg in enumerate(cfgs):
        here = f"{where}: datasets[{i}] ({cfg.get('abbr')})"
        try:
            ds = built[i] if i < len(built) else build_dataset(cfg)
            key = ds.content_key()
            if _usable(cache.get(key)):
                facts: dict[str, Any] = cache[key]
            else:  # unknown, or left by another version or a hand edit: read again
                facts = _probe(ds)
                fresh[key] = facts
        except ConfigError as exc:
            raise ConfigError(f"{here}: {exc}") from None
        if facts["num_rows"] == 0:  # not "column 'x' not in FILE; columns are:" with nothing after it
            raise ConfigError(f"{here}: {ds.path} holds no rows; put at least one row in it or drop the dataset")
        cluster = ds.eval_cfg.get("cluster_key")  # each row's cluster (docs/statistics.md)
        for col in [*ds.needed_columns(), *([cluster] if isinstance(cluster, str) else [])]:
            row = facts.get("partial", {}).get(col)
            if row is not None:
                raise ConfigError(f"{here}: column {col!r} is missing from row {row} of {ds.path} "
                                  "(earlier rows have it); every row needs it")
        ds.check(facts["columns"], here)
        # test_range is applied to the probed size without reading the rows again.
        test_range = ds.reader_cfg.get("test_range")
        lo, hi = parse_range(test_range, f"{where}: datasets[{i}].reader_cfg")
        size = len(range(facts["num_rows"])[lo:hi])
        if size == 0:
            raise ConfigError(f"{here}: reader_cfg.test_range={test_range!r} selects no rows of the "
                              f"{facts['num_rows']} in {ds.path}; widen it or drop the dataset")
        infos.append(
            DatasetInfo(cfg, ds.abbr, size, ds.inferencer.get("type", "gen"), facts["num_choices"], key)
        )
    if fresh and write_cache:
        _remember(path, fresh)
    return infos


def _plan_together(cfgs: list[dict[str, Any]], known: Callable[[str], bool]) -> list[BaseDataset]:
    """The datasets of ``cfgs`` up to the first that cannot be built (which the caller reports),
    each type asked first to gather its facts at once (:meth:`BaseDataset.plan_together`: all
    lm-eval tasks of a config probed by one process, not one each)."""
    built: list[BaseDataset] = []
    for cfg in cfgs:
        try:
            built.append(build_dataset(cfg))
        except ConfigError:
            break
    by_type: dict[type[BaseDataset], list[BaseDataset]] = {}
    for ds in built:
        by_type.setdefault(type(ds), []).append(ds)
    for cls, group in by_type.items():
        cls.plan_together(group, known)
    return built


def _remember(path: str, fresh: dict[str, Any]) -> None:
    """Add facts to the size cache; a cache folder that cannot be written costs a warning only."""
    try:
        private_cache_dir()
        with FileLock(path + ".lock", timeout=30):
            try:
                with open(path, encoding="utf-8") as f:
                    cache = json.load(f)
            except (OSError, ValueError):
                cache = {}
            cache.update(fresh)
            atomic_write_json(path, cache)
    except OSError as exc:
        print(f"orchestra: warning: dataset size cache {path} not written ({exc.strerror or exc}); "
              "set ORCHESTRA_CACHE_DIR to a writable folder to keep it", file=sys.stderr)
