"""Which documents of an lm-eval task orchestra evaluates, and which files the task reads.

Runs where ``lm_eval`` is imported (the planning probe and the tasks), never in the orchestrator.

- :func:`select` loads the task or group once and applies ``test_range`` to each subtask as the
  planner counted it (``range(n)[lo:hi]``, negative bounds included).  A subtask with nothing in
  range contributes nothing: it is taken out of the task list (and a group left with no subtask
  out of its parent), because lm-eval reads an empty ``--samples`` list as "all documents".
- :func:`check_fewshot` refuses, at planning time, a ``num_fewshot`` that lm-eval cannot draw
  from a subtask's few-shot pool (``Sample larger than population`` inside every attempt).
- :func:`task_inputs` lists what the task reads (its YAMLs and the ones they include, the
  Python files their ``!function`` tags name, local data files and folders), for the content key
  (:mod:`orchestra.datasets.lmeval_plan`).
"""

from __future__ import annotations

import glob
import itertools
import os
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from orchestra.errors import ConfigError

#: paths a glob of ``dataset_kwargs`` yields at most (symbolic links to a parent folder make
#: ``**`` recurse into itself: two of them, 2**40 paths before the kernel's ELOOP ends it)
MAX_GLOB_PATHS = 100_000

@dataclass
class Selection:
    """A loaded task or group, restricted to the documents in range."""

    items: list[Any]  # top-level Task / Group objects to hand to simple_evaluate (empty subtasks out)
    counts: list[tuple[str, int]]  # every subtask by name, with its documents in range (0: left out)
    picked: dict[str, list[int]]  # the document indices of each subtask that has some
    limit: int | None  # lm-eval's --limit when the range is a prefix [0:N], else None (use picked)
    loaded: dict[str, Any] = field(repr=False)  # TaskManager.load's answer, pruned
    every: dict[str, Any] = field(repr=False, default_factory=dict)  # every task and group loaded, by name


def _prefix_limit(lo: int | None, hi: int | None) -> tuple[bool, int | None]:
    """Whether ``[lo:hi]`` is lm-eval's ``--limit`` (a prefix, or everything), and the limit."""
    if lo in (None, 0) and (hi is None or hi > 0):
        return True, hi
    return False, None


def _prune(loaded: dict[str, Any], empty: set[str]) -> list[Any]:
    """Take the ``empty`` subtasks (and groups left without children) out of ``loaded``; the
    top-level items left, groups first, each by name."""
    groups: dict[str, Any] = loaded["groups"]
    gone = set(empty)
    changed = True
    while changed:
        changed = False
        for name, group in list(groups.items()):
            for child in list(group.child_names):
                if child in gone:
                    group.pop(child)
            if len(group) == 0:
                del groups[name]
                gone.add(name)
                changed = True
    loaded["tasks"] = {n: t for n, t in loaded["tasks"].items() if n not in gone}
    loaded["group_map"] = {n: g.child_names for n, g in groups.items()}
    children = {c for g in groups.values() for c in g.child_names}
    return ([g for n, g in sorted(groups.items()) if n not in children]
            + [t for n, t in sorted(loaded["tasks"].items()) if n not in children])


def select(settings: dict[str, Any], tm: Any, unsupported: dict[str, str],
           kinds: dict[str, str] | None = None) -> Selection:
    """Load ``settings['task']`` with ``tm`` and keep the documents in ``test_range``;
    ``unsupported`` maps an ``output_type`` orchestra cannot answer to why; ``kinds`` gets each
    subtask's ``output_type``."""
    loaded = tm.load([settings["task"]])
    every = {**loaded["groups"], **loaded["tasks"]}
    lo, hi = settings["test_range"]
    counts: list[tuple[str, int]] = []
    picked: dict[str, list[int]] = {}
    for name in sorted(loaded["tasks"]):
        obj = loaded["tasks"][name]
        kind = obj.get_config("output_type")
        if kind in unsupported:
            raise ConfigError(f"lm-eval task {name}: {unsupported[kind]}")
        if kinds is not None:
            kinds[name] = str(kind)
        ids = list(range(len(obj.eval_docs))[lo:hi])
        counts.append((name, len(ids)))
        if ids:
            picked[name] = ids
    items = _prune(loaded, {name for name, n in counts if n == 0})
    is_prefix, limit = _prefix_limit(lo, hi)
    return Selection(items, counts, picked, limit if is_prefix else None, loaded, every)


def samples_arg(sel: Selection, settings: dict[str, Any]) -> dict[str, list[int]] | None:
    """simple_evaluate's ``samples``: None where ``limit`` says it (a prefix of each subtask)."""
    lo, hi = settings["test_range"]
    return None if _prefix_limit(lo, hi)[0] else dict(sel.picked)


def shots(obj: Any, num_fewshot: int | None) -> int:
    """The few-shot count lm-eval's simple_evaluate gives a task (its YAML's 0 stays 0)."""
    own = obj.get_config("num_fewshot")
    if num_fewshot is None:
        return int(own or 0)
    return 0 if own == 0 else int(num_fewshot)


def check_fewshot(sel: Selection, settings: dict[str, Any]) -> None:
    """Build one document's few-shot context per subtask, as the tasks will; a count lm-eval
    cannot draw is a ``ConfigError`` naming the subtask, the count and its pool."""
    for name, ids in sorted(sel.picked.items()):
        obj = sel.loaded["tasks"][name]
        n = shots(obj, settings["num_fewshot"])
        if n == 0:
            continue
        try:
            obj.fewshot_context(doc=obj.eval_docs[ids[0]], num_fewshot=n)
        except Exception as exc:  # lm-eval's own words (ValueError, AssertionError, ...), in one line
            try:
                pool = f"{len(obj.sampler.fewshot_docs())} documents"
            except Exception:
                pool = "no documents"
            words = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"lm-eval task {name}: num_fewshot={n} cannot be drawn from its few-shot pool "
                              f"({pool}; lm-eval: {words}); lower num_fewshot or give the task a "
                              "fewshot_split") from None


# -- what a task reads --------------------------------------------------------------------------


def _refs(path: str) -> tuple[list[str], list[str]]:
    """The files a task YAML includes and the ``!function`` references it makes (``utils.f``)."""
    functions: list[str] = []

    class Loader(yaml.SafeLoader):
        pass

    def ctor(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        spec = str(loader.construct_scalar(node))
        functions.append(spec)
        return spec

    Loader.add_constructor("!function", ctor)
    try:
        with open(path, "rb") as f:
            cfg = yaml.load(f, Loader=Loader)  # noqa: S506 - SafeLoader plus the one tag
    except (OSError, yaml.YAMLError):
        return [], functions
    inc = cfg.get("include") if isinstance(cfg, dict) else None
    includes = [str(i) for i in (inc if isinstance(inc, list) else [inc] if inc else [])]
    base = os.path.dirname(path)
    return [i if os.path.isabs(i) else os.path.join(base, i) for i in includes], functions


def _function_file(spec: str, base: str) -> str | None:
    """The Python file lm-eval loads for ``!function spec`` in a YAML of folder ``base``."""
    module = spec.rpartition(".")[0]
    if not module:
        return None
    local = os.path.join(base, module.replace(".", os.sep) + ".py")
    if os.path.isfile(local):
        return os.path.realpath(local)
    import importlib.util

    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return found.origin if found is not None and found.origin and os.path.isfile(found.origin) else None


def _yaml_files(start: list[str]) -> list[str]:
    """``start`` and every YAML they include (transitively), and the Python their functions name."""
    todo = [os.path.realpath(p) for p in start]
    seen: set[str] = set()
    python: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        includes, functions = _refs(path)
        todo.extend(os.path.realpath(p) for p in includes)
        for spec in functions:
            found = _function_file(spec, os.path.dirname(path))
            if found:
                python.add(found)
    return sorted(seen) + sorted(python)


def _local_paths(value: Any) -> list[str]:
    """Files and folders on this machine that a ``dataset_kwargs`` value names (globs expanded)."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in _local_paths(v)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _local_paths(v)]
    if not isinstance(value, str) or not value or "\n" in value:
        return []
    path = os.path.expanduser(value)
    if any(c in path for c in "*?["):
        return sorted(os.path.abspath(p) for p in itertools.islice(glob.iglob(path, recursive=True), MAX_GLOB_PATHS))
    return [os.path.abspath(path)] if os.path.exists(path) else []


def _regular(path: str) -> bool:
    """A regular file (a link to one too): what can be hashed; a FIFO would block its reader
    and a link to ``/dev/zero`` never end it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _files_under(path: str) -> list[str]:
    if not os.path.isdir(path):
        return [path] if _regular(path) else []
    return sorted(p for d, _dirs, names in os.walk(path) for n in names if _regular(p := os.path.join(d, n)))


def task_inputs(sel: Selection, settings: dict[str, Any], tm: Any) -> dict[str, list[str]]:
    """``names``: the task, group and tag names the dataset resolves through lm-eval's index;
    ``files``: everything it reads (YAMLs, included YAMLs, ``!function`` Python, local data)."""
    names = sorted({settings["task"], *sel.every})
    yamls = []
    for name in names:
        entry = tm.task_index.get(name)
        if entry is not None and getattr(entry, "yaml_path", None):
            yamls.append(str(entry.yaml_path))
    files = set(_yaml_files(yamls))
    from lm_eval.api.task import Task

    for obj in sel.every.values():
        if not isinstance(obj, Task):  # a group: its YAML is listed above
            continue
        sources = [obj.get_config("dataset_path"), obj.get_config("dataset_kwargs")]
        for path in _local_paths(sources):
            files.update(_files_under(path))
    return {"names": names, "files": sorted(files)}
