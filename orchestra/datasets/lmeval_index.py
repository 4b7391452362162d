"""lm-eval's index of its own task folder, kept in orchestra's cache between processes.

``TaskManager()`` walks and parses every YAML under ``lm_eval/tasks`` (about 15,000 tasks,
some 15 s of CPU) each time it is built, and the planning probe, every infer task and every
eval task of an lm-eval dataset build one.  That part of the index depends only on the
installed lm-eval, so it is kept as JSON in ``<cache>/lmeval_index/<key>.json`` (key:
lm-eval's version, its task folder and that folder's stamp) and read back in well under a
second.  The ``include_path`` folders are indexed every time, as lm-eval does, and override
stock names the same way.  A stock YAML edited in place inside site-packages is not noticed:
delete the cache file.  A file that cannot be read or written only makes it slower.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from orchestra.datasets.digest import cache_dir, persisting
from orchestra.fileio import atomic_write_text, stable_hash
from orchestra.privdir import private_cache_dir


def _cache_path(folder: Path) -> str:
    stamps = []
    for path in (folder, folder / "manager.py"):
        st = os.stat(path)
        stamps.append([st.st_size, st.st_mtime_ns, st.st_ino])
    key = stable_hash([importlib.metadata.version("lm_eval"), str(folder), stamps])
    return os.path.join(cache_dir(), "lmeval_index", f"{key}.json")


def _read(path: str) -> dict[str, Any] | None:
    from lm_eval.tasks._index import Entry, Kind

    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)
        return {name: Entry(name=name, kind=Kind[kind], yaml_path=None if where is None else Path(where),
                            cfg=cfg, tags=set(tags))
                for name, kind, where, cfg, tags in rows}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: str, index: dict[str, Any]) -> None:
    rows = [[e.name, e.kind.name, None if e.yaml_path is None else str(e.yaml_path), e.cfg, sorted(e.tags)]
            for e in index.values()]
    try:
        text = json.dumps(rows, allow_nan=False)
        if [r[0] for r in rows] != list(index) or json.loads(text) != rows:
            return  # not kept exactly as JSON: built each time
        private_cache_dir("lmeval_index")
        atomic_write_text(path, text)
    except (OSError, ValueError, TypeError):
        pass


def task_manager(include_path: list[str]) -> Any:
    """``lm_eval.tasks.TaskManager(include_path=...)``, with its stock folder's index read from
    the cache (built and kept there the first time)."""
    from lm_eval.tasks import TaskManager

    try:  # lm-eval's own index builder (0.4.x); another shape: the plain TaskManager
        from lm_eval.tasks import _index, manager

        folder = Path(manager.__file__).parent  # the folder TaskManager indexes first
        raw = _index.TaskIndex.__dict__["build"]
        build = _index.TaskIndex.build
        path = _cache_path(folder)
    except (ImportError, AttributeError, KeyError, OSError):
        return TaskManager(include_path=include_path or None)
    stock = _read(path)
    if stock is None:
        stock = build([folder])
        if persisting():
            _write(path, stock)

    def cached_build(paths: Any, *, resolve_includes: bool = True) -> dict[str, Any]:
        paths = list(paths)
        if not resolve_includes or paths[:1] != [folder]:
            return build(paths, resolve_includes=resolve_includes)
        index = dict(stock)  # later folders override earlier ones, as TaskIndex.build merges them
        index.update(build(paths[1:]))
        return index

    _index.TaskIndex.build = staticmethod(cached_build)
    try:
        return TaskManager(include_path=include_path or None)
    finally:
        _index.TaskIndex.build = raw
