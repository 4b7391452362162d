"""lm-eval's torch seed without importing torch: the seed is set when torch is first imported.

``simple_evaluate(torch_random_seed=1234)`` imports torch only to call ``torch.manual_seed``
(~2-3 s of CPU and ~300 MB in each task process), though an lm-eval task on an API or test model
never uses torch.  An HF model in the same process loads after the requests are collected and
may draw from torch's global generator, so it must find it as lm-eval leaves it.
:func:`seed_arg` gives the seed to pass: lm-eval's own when torch is already imported (it seeds
it as always), else ``None`` with a one-shot import hook that calls ``torch.manual_seed`` right
after torch's module has executed.  Nothing can draw from torch's generator before torch is
imported, so its state is the same either way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

_LOCK = threading.Lock()


class _SeedOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asked for torch, it gives the spec the other finders give, with a
    loader that seeds torch once its module has executed and then removes this finder from
    ``sys.meta_path``.  Only an executed torch removes it: ``importlib.util.find_spec('torch')``
    (transformers asks it on import) loads nothing."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _SeedingLoader(spec.loader, self)
                return spec
        return None


class _SeedingLoader(importlib.abc.Loader):
    """torch's own loader, then ``torch.manual_seed(seed)``; the module keeps its own loader."""

    def __init__(self, loader: Any, finder: _SeedOnImport) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        module.manual_seed(self.finder.seed)
        _remove(self.finder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _remove(finder: _SeedOnImport) -> None:
    with _LOCK:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def seed_arg(seed: int | None) -> int | None:
    """The ``torch_random_seed`` to pass to ``simple_evaluate``: ``seed`` when torch is already
    imported (or no seed is asked), else ``None``, torch being seeded with ``seed`` when this
    process first imports it (one hook, however many evaluations ask before)."""
    if seed is None or "torch" in sys.modules:
        return seed
    with _LOCK:
        for finder in sys.meta_path:
            if isinstance(finder, _SeedOnImport):
                finder.seed = seed
                return None
        sys.meta_path.insert(0, _SeedOnImport(seed))
    return None
