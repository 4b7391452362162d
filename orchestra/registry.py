"""Resolve the ``type`` of a config dict to a class, without importing heavy modules.

A ``type`` may be a class, a dotted path (``'orchestra.models.hf.HFCausalLM'``, which is
what mmengine makes of an import in a pure-Python config), or a short name registered
here.  Each short name maps to a dotted path so that nothing is imported until it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchestra.errors import ConfigError


class Registry:
    """Short names of one kind of component, each mapped to a dotted import path."""

    def __init__(self, kind: str, entries: dict[str, str], base: str | None = None) -> None:
        self.kind = kind
        self.base = base  # dotted path of the class every entry must derive from, if any
        self._entries: dict[str, str] = {}
        for name, target in entries.items():
            self.register(name, target)

    def register(self, name: str, target: str) -> None:
        if name in self._entries:
            raise KeyError(f"{self.kind} {name!r} is already registered as {self._entries[name]}")
        self._entries[name] = target

    def names(self) -> list[str]:
        return sorted(self._entries)

    def resolve(self, spec: Any, where: str) -> type:
        """Return the class ``spec`` names; a ``ConfigError`` naming ``where`` if there is none."""
        if isinstance(spec, type):
            if _unimportable(dotted_name(spec)) or import_dotted(dotted_name(spec)) is not spec:
                raise ConfigError(f"{where}: {self.kind} type {dotted_name(spec)!r} {NOT_BY_NAME}")
            return self._of_base(spec, dotted_name(spec), where)
        if not isinstance(spec, str) or not spec:
            raise ConfigError(f"{where}: type must be a class or a name, got {spec!r}")
        target = self._entries.get(spec, spec)
        if _unimportable(target):
            raise ConfigError(f"{where}: {self.kind} type {spec!r} {NOT_BY_NAME}")
        try:
            cls = import_dotted(target)
        except ImportError as exc:  # the module exists, but something it imports is not installed
            raise ConfigError(f"{where}: {self.kind} type {spec!r} cannot be imported: {exc}") from None
        if cls is None or not isinstance(cls, type):
            raise ConfigError(
                f"{where}: unknown {self.kind} type {spec!r}; valid: {', '.join(self.names())} "
                "or a dotted path to a class"
            )
        return self._of_base(cls, spec, where)

    def _of_base(self, cls: type, spec: str, where: str) -> type:
        """``cls`` if it derives from this kind's base class (a class given itself or by its name)."""
        if self.base is not None:
            base = import_dotted(self.base)
            if isinstance(base, type) and not issubclass(cls, base):
                raise ConfigError(
                    f"{where}: {spec!r} is not a {self.kind} ({dotted_name(cls)} does not derive from "
                    f"{base.__name__}); valid: {', '.join(self.names())} or a dotted path to one"
                )
        return cls


#: why a class of the script being run (``__main__``) or of a function's body cannot be a ``type``
NOT_BY_NAME = ("cannot be imported by the task processes, which import a type by its name (a class defined in the "
               "script being run or inside a function); define it in a module on PYTHONPATH and import it from there")


def _unimportable(path: str) -> bool:
    """Whether a dotted path names a class no other process can import: one of the script being
    run (``__main__``: another process's ``__main__`` is another script) or of a function's body."""
    return path.startswith("__main__.") or path.startswith("__main__:") or "<locals>" in path


def import_dotted(path: str) -> Any:
    """Import ``'pkg.mod.Name'``, ``'pkg.mod.Outer.Inner'`` (a nested class: the longest prefix
    that is a module is imported) or ``'pkg.mod:Name'``; ``None`` if it does not exist."""
    if ":" in path:
        mod_name, _, attr = path.partition(":")
        splits = [(mod_name, attr)] if mod_name else []
    else:
        parts = path.split(".")
        splits = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    for mod_name, attr in splits:
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            # Only "the named module does not exist" means "try a shorter one"; a missing
            # dependency of an existing module is a real error and must surface.
            if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
                continue
            raise
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj
    return None


def dotted_name(cls: type) -> str:
    """The dotted path under which ``cls`` can be imported again."""
    return f"{cls.__module__}.{cls.__qualname__}"


MODELS = Registry(
    "model",
    {
        "HFCausalLM": "orchestra.models.hf.HFCausalLM",
        "VLLMModel": "orchestra.models.vllm.VLLMModel",
        "OpenAIAPI": "orchestra.models.openai_api.OpenAIAPI",
        "AnthropicAPI": "orchestra.models.anthropic_api.AnthropicAPI",
        "DeterministicModel": "orchestra.models.fake.DeterministicModel",
    },
    base="orchestra.models.base.BaseModel",
)
DATASETS = Registry(
    "dataset",
    {
        "JsonlDataset": "orchestra.datasets.files.JsonlDataset",
        "CsvDataset": "orchestra.datasets.tabular.CsvDataset",
        "ArrowDataset": "orchestra.datasets.tabular.ArrowDataset",
        "OlmoEvalDataset": "orchestra.datasets.olmo.OlmoEvalDataset",
        "LmEvalDataset": "orchestra.datasets.lmeval.LmEvalDataset",
    },
    base="orchestra.datasets.base.BaseDataset",
)
PARTITIONERS = Registry(
    "partitioner",
    {
        "NaivePartitioner": "orchestra.partitioners.naive.NaivePartitioner",
        "SizePartitioner": "orchestra.partitioners.size.SizePartitioner",
        "NumWorkerPartitioner": "orchestra.partitioners.num_worker.NumWorkerPartitioner",
    },
    base="orchestra.partitioners.base.BasePartitioner",
)
RUNNERS = Registry(
    "runner",
    {
        "LocalRunner": "orchestra.runners.local.LocalRunner",
        "SlurmRunner": "orchestra.runners.slurm.SlurmRunner",
        "DLCRunner": "orchestra.runners.dlc.DLCRunner",
        "RayRunner": "orchestra.runners.ray.RayRunner",
    },
    base="orchestra.runners.base.BaseRunner",
)
TASKS = Registry(
    "task",
    {
        "InferTask": "orchestra.tasks.kinds.InferTask",
        "EvalTask": "orchestra.tasks.kinds.EvalTask",
    },
)
EVALUATORS = Registry(
    "evaluator",
    {
        "accuracy": "orchestra.evaluators.basic.AccuracyEvaluator",
        "exact_match": "orchestra.evaluators.basic.ExactMatchEvaluator",
        "numeric_match": "orchestra.evaluators.basic.NumericMatchEvaluator",
        "code_exec": "orchestra.evaluators.code.CodeExecEvaluator",
        "judge": "orchestra.evaluators.judge.JudgeEvaluator",
    },
    base="orchestra.evaluators.basic.BaseEvaluator",
)
