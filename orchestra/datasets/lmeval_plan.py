"""Planning an lm-eval dataset without importing lm-eval: its content key, and the probe's environment.

**Content key.**  An lm-eval task reads more than the YAMLs under ``include_path``: data files
beside the task folder (``tools/lmeval_offline_tasks.py`` writes ``OUT/data`` beside
``OUT/tasks``), YAMLs it ``include:``s from elsewhere, the Python its ``!function`` tags name.
The probe lists them (``inputs``, see :func:`orchestra.datasets.lmeval_select.task_inputs`);
that list, the *manifest*, is kept in ``<cache>/lmeval_inputs.json`` under a key of the
settings and the lm-eval version, with each file's digest.  The content key is made of the
manifest's files (their SHA-256, :mod:`orchestra.datasets.digest`) and of the YAMLs under
``include_path`` that declare one of the names the task resolves (a file that starts to
declare it changes which YAML lm-eval loads).  A task is keyed on its own inputs: editing an
unrelated task's YAML in the same folder changes nothing.  A manifest whose files changed is
made again by a new probe before the key is computed, so the key of a task is the same in
every run that sees the same files.  The manifest also records each subtask's ``output_type``
(:func:`output_kinds`): the config check of a model that cannot report ``is_greedy`` reads it
instead of running the probe again.

**Probe environment.**  Listing or planning a task folder runs its code (a ``!function``
module is imported when lm-eval loads the YAML), as lm-eval itself does; the probe runs with
the orchestrator's environment less every secret-looking variable
(:func:`orchestra.secretnames.secret_variables`) but the Hugging Face token lm-eval may need to
download a task's data.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import yaml

from orchestra.datasets.digest import cache_dir, files_stamp, persisting, stamped_key
from orchestra.fileio import atomic_write_json
from orchestra.privdir import private_cache_dir
from orchestra.secretnames import secret_variables

#: secret-looking variables the probe keeps: lm-eval loads task data from the Hugging Face hub
HUB_TOKENS = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
_IGNORE_DIRS = {"__pycache__", ".ipynb_checkpoints"}
#: names each YAML declares, by (path, size, mtime, inode): read once per process
_DECLARED: dict[tuple[str, int, int, int], list[str]] = {}


def probe_env() -> dict[str, str]:
    """The orchestrator's environment without its secrets (API keys, passwords), for the probe."""
    drop = set(secret_variables(os.environ)) - HUB_TOKENS
    return {k: v for k, v in os.environ.items() if k not in drop}


def _load_names(path: str, seen: set[str]) -> dict[str, Any]:
    """A YAML's settings with its includes merged (functions left unresolved), as lm-eval's index reads it."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: "function")
    real = os.path.realpath(path)
    if real in seen:
        raise ValueError(f"include cycle at {path}")
    seen.add(real)
    with open(path, "rb") as f:
        cfg = yaml.load(f, Loader=Loader)  # noqa: S506 - SafeLoader plus the one tag
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a mapping")
    inc = cfg.pop("include", None)
    merged: dict[str, Any] = {}
    for item in inc if isinstance(inc, list) else [inc] if inc else []:
        item = str(item)
        merged.update(_load_names(item if os.path.isabs(item) else os.path.join(os.path.dirname(path), item), seen))
    merged.update(cfg)
    return merged


def declared_names(path: str) -> list[str]:
    """The task, group and tag names a YAML declares (``['?']`` when it cannot be read)."""
    try:
        st = os.stat(path)
    except OSError:
        return ["?"]
    stamp = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if stamp not in _DECLARED:
        try:
            cfg = _load_names(path, set())
            tags = cfg.get("tag") or []
            own = cfg.get("group") or cfg.get("task")
            names = [own] if isinstance(own, str) else []
            names += [tags] if isinstance(tags, str) else [str(t) for t in tags if isinstance(t, str)]
            _DECLARED[stamp] = sorted(set(names))
        except (OSError, ValueError, yaml.YAMLError):
            _DECLARED[stamp] = ["?"]
    return _DECLARED[stamp]


def index_stamp(include_path: list[str], names: list[str]) -> list[list[Any]]:
    """The YAMLs under ``include_path`` that declare one of ``names`` (or cannot be read), with
    what they declare: which files lm-eval's index resolves the task through."""
    wanted = set(names) | {"?"}
    out: list[list[Any]] = []
    for root in include_path:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _IGNORE_DIRS)
            for name in sorted(files):
                if name.endswith(".yaml"):
                    path = os.path.join(folder, name)
                    declared = declared_names(path)
                    if wanted & set(declared):
                        out.append([path, declared])
    return out


def _manifests_path() -> str:
    return os.path.join(cache_dir(), "lmeval_inputs.json")


def _read_manifests() -> dict[str, Any]:
    """The manifests on disk (read once per process; :func:`content_key` keeps those it uses)."""
    path = _manifests_path()
    if path not in _DISK:
        _DISK.clear()
        _DISK[path] = _load_manifests(path)
    return _DISK[path]


def _load_manifests(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(key: str, manifest: dict[str, Any]) -> None:
    """Keep a manifest on disk (not with ``--dry-run``); a cache that cannot be written is only slower."""
    if not persisting():
        return
    from filelock import FileLock

    path = _manifests_path()
    try:
        private_cache_dir()
        with FileLock(path + ".lock", timeout=30):
            data = _load_manifests(path)
            data[key] = manifest
            atomic_write_json(path, data)
    except OSError:
        pass


def _usable(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("files"), list) and isinstance(entry.get("names"), list)
            and all(isinstance(f, str) for f in entry["files"]) and all(isinstance(n, str) for n in entry["names"]))


#: manifests used by this process, by manifest key; the disk file's content, by its path
_MANIFESTS: dict[str, dict[str, Any]] = {}
_DISK: dict[str, dict[str, Any]] = {}


def _manifest_key(version: str, settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([version, settings], sort_keys=True).encode()).hexdigest()[:24]


def _current(mkey: str, settings: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Any]]:
    """The manifest kept under ``mkey`` and the state of its files, or ``(None, [])`` when there
    is none, its files changed, or it predates recorded output types (made again once, with them)."""
    entry = _MANIFESTS.get(mkey) or _read_manifests().get(mkey)
    if not _usable(entry):
        return None, []
    assert entry is not None
    state = [files_stamp(entry["files"]), index_stamp(settings["include_path"], entry["names"])]
    if state != entry.get("state") or "kinds" not in entry:
        return None, []
    return entry, state


def manifest_current(version: str, settings: dict[str, Any]) -> bool:
    """Whether :func:`content_key` can key these settings without asking the probe (the planner
    then asks the probe only for datasets whose facts the size cache lacks)."""
    return _current(_manifest_key(version, settings), settings)[0] is not None


def output_kinds(version: str, settings: dict[str, Any]) -> dict[str, str] | None:
    """Each subtask's ``output_type`` as the manifest :func:`content_key` last used for these
    settings recorded it (None: not recorded; ask the probe).  Call it after ``content_key``."""
    mkey = _manifest_key(version, settings)
    kinds = (_MANIFESTS.get(mkey) or {}).get("kinds")
    return dict(kinds) if isinstance(kinds, dict) else None


def content_key(kind: str, version: str, settings: dict[str, Any], probe: Callable[[], dict[str, Any]]) -> str:
    """The content key of an lm-eval dataset: its settings, the lm-eval version, and the digests
    of the files its task reads; ``probe()`` (the probe subprocess's answer) is asked only when
    no manifest is known or one of its files changed."""
    mkey = _manifest_key(version, settings)
    entry, state = _current(mkey, settings)
    if entry is None:
        answer = probe()
        inputs = answer.get("inputs") or {}
        entry = {"files": sorted(inputs.get("files", [])), "names": sorted(inputs.get("names", [])),
                 "kinds": dict(answer.get("output_types") or {})}
        state = [files_stamp(entry["files"]), index_stamp(settings["include_path"], entry["names"])]
        entry["state"] = state
        _remember(mkey, entry)
    assert entry is not None
    _MANIFESTS[mkey] = entry
    return stamped_key(kind, [version, settings, entry["files"], state], {})
