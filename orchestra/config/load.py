"""Read a config file (``.py`` with mmengine's ``read_base``, ``.yaml``, ``.json``) and apply
``--cfg-options`` overrides; every failure is one ``ConfigError`` line naming the file."""

from __future__ import annotations

import ast
import os
import re
from typing import Any

from orchestra.errors import ConfigError
from orchestra.keyvalues import NON_FINITE, non_finite


def load_config(path: str, cfg_options: list[str] | None = None) -> dict[str, Any]:
    """Read a ``.py`` / ``.yaml`` / ``.json`` config and apply ``a.b=value`` overrides."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found")
    ext = os.path.splitext(path)[1]
    if ext not in (".py", ".yaml", ".yml", ".json"):
        raise ConfigError(f"{path}: unsupported config type {ext!r}; use .py, .yaml or .json")
    if ext != ".py":
        _check_data_file(path)
    from mmengine.config import Config

    try:
        cfg = Config.fromfile(path)
    except SyntaxError as exc:
        line = f" line {exc.lineno}" if exc.lineno else ""
        raise ConfigError(f"{path}:{line} syntax error: {exc.msg}") from None
    except Exception as exc:  # mmengine wraps user-code errors in many types
        raise ConfigError(f"{_where_in_config(exc, path)}: cannot load config: {_load_problem(exc)}") from None
    if cfg_options:
        items = [(item, *parse_override(item)) for item in cfg_options]
        for item, key, value in items:  # one at a time, so that a failure names its item
            try:
                cfg.merge_from_dict({key: value})
            except Exception as exc:  # mmengine: KeyError, IndexError, TypeError, AttributeError
                raise ConfigError(f"--cfg-options {item!r}: {_merge_problem(cfg.to_dict(), key, exc)}") from None
    return to_plain(cfg.to_dict())


def _merge_problem(raw: dict[str, Any], key: str, exc: Exception) -> str:
    """Why mmengine could not set ``key`` in ``raw``, in one line that says what is valid (never
    mmengine's own words for an index, which quote the whole list, secrets and all)."""
    target: Any = raw
    parts = key.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the config"
        if isinstance(target, list):
            if not part.isdigit() or int(part) >= len(target):
                return f"{where} has {len(target)} item(s); {part!r} is not one of its indices"
            target = target[int(part)]
        elif isinstance(target, dict) and part in target:
            target = target[part]
        else:
            target = None
            break
    if isinstance(exc, AttributeError) and isinstance(target, dict):  # a dict given a value that is not one
        return f"{key} holds a dict; set a key inside it (e.g. {key}.abbr=...) or give a dict such as {{'abbr': 'x'}}"
    return _one_line(exc)


def _check_data_file(path: str, seen: tuple[str, ...] = ()) -> None:
    """Parse a ``.yaml`` / ``.json`` config (and its ``_base_`` files) safely first: a syntax
    error names the file and line, and a YAML ``!!python`` tag, which would run code when
    mmengine loads the file, is refused."""
    import json

    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: JSON syntax error: {exc.msg}") from None
    except yaml.constructor.ConstructorError as exc:
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise ConfigError(f"{path}{line}: YAML tag not allowed ({exc.problem}); a config holds plain values "
                          "(tags such as !!python/object would run code)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: YAML syntax error: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        got = "nothing" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{path}: a config is a mapping of keys (models, datasets, infer, eval, work_dir, ...), "
                          f"got {got}")
    bases = data.get("_base_")
    if bases is None:
        return
    names = [bases] if isinstance(bases, str) else bases
    if not isinstance(names, list) or not all(isinstance(b, str) for b in names):
        raise ConfigError(f"{path}: _base_: expected a file name or a list of file names, got {bases!r}")
    for base in names:
        full = os.path.normpath(os.path.join(os.path.dirname(path), base))
        if full in (*seen, os.path.normpath(path)):
            chain = " -> ".join(os.path.basename(p) for p in (*seen, path, full))
            raise ConfigError(f"{path}: _base_ {base!r} inherits from itself ({chain}); remove one _base_")
        if os.path.splitext(full)[1] in (".yaml", ".yml", ".json") and os.path.isfile(full):
            _check_data_file(full, (*seen, os.path.normpath(path)))


#: what ``float()`` reads as NaN or infinity (signs stripped, lower case)
_NON_FINITE_WORDS = ("nan", "inf", "infinity")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|\d+))*")


def parse_override(item: str) -> tuple[str, Any]:
    """One ``--cfg-options`` item ``KEY=VALUE`` as (dotted key, value).

    The value is a Python literal when it reads as one (``4``, ``0.5``, ``True``, ``None``,
    ``'text'``, ``[1, 2]``, ``dict(...)`` is not: write ``{'a': 1}``); otherwise it is the text
    exactly as typed, spaces and commas included.  Text that starts like a literal (a quote,
    ``[``, ``(`` or ``{``) but does not parse is an error, not silently a string.  No value is NaN
    or infinite (``nan``, ``inf``, ``1e999``): no setting takes one.
    """
    key, eq, text = item.partition("=")
    if not eq:
        raise ConfigError(f"--cfg-options {item!r}: expected KEY=VALUE (e.g. infer.runner.max_num_workers=4)")
    if not _KEY.fullmatch(key):
        raise ConfigError(f"--cfg-options {item!r}: {key!r} is not a dotted key such as infer.runner.retry "
                          "or models.0.batch_size")
    if text.strip().lower().lstrip("+-") in _NON_FINITE_WORDS:
        # Python's float() reads these words, and a user who types them means a number: say that
        # no setting takes one rather than pass on the text (quoted, it is the text)
        raise ConfigError(f"--cfg-options {item!r}: expected a finite number ({NON_FINITE}); "
                          f"quote it as '{text.strip()}' if you mean the text")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        if text.lstrip()[:1] in ("'", '"', "[", "(", "{"):
            problem = exc.msg if isinstance(exc, SyntaxError) else "text inside it is not quoted"
            raise ConfigError(f"--cfg-options {item!r}: the value is not a valid Python literal ({problem}); "
                              "quote text as 'text'") from None
        return key, text
    bad = non_finite(value)  # 1e999 is a literal, and it is infinity
    if bad is not None:
        raise ConfigError(f"--cfg-options {item!r}: expected a finite number, got {bad[1]!r} ({NON_FINITE})")
    return key, value


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set dotted keys (``infer.runner.retry``, ``models.0.batch_size``) in a plain config dict."""
    for key, value in overrides.items():
        if not _KEY.fullmatch(key):
            raise ConfigError(f"override {key!r}: not a dotted key such as infer.runner.retry or models.0.batch_size")
        target: Any = raw
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(target, list):
                if not part.isdigit() or int(part) >= len(target):
                    raise ConfigError(f"override {key!r}: {'.'.join(parts[:i]) or 'the config'} has "
                                      f"{len(target)} item(s); {part!r} is not one of its indices")
                if last:
                    target[int(part)] = value
                else:
                    target = target[int(part)]
            elif isinstance(target, dict):
                if last:
                    target[part] = value
                else:
                    target = target.setdefault(part, {})
            else:
                raise ConfigError(f"override {key!r}: {'.'.join(parts[:i])} holds {target!r}, not a dict or list")


def _load_problem(exc: BaseException) -> str:
    """What went wrong while a config file was executed, in one line."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if (
        isinstance(exc, RuntimeError)
        and not str(exc)
        and frames
        and frames[-1].filename.endswith(os.path.join("mmengine", "config", "lazy.py"))
    ):
        # mmengine turns every import of a pure-Python config into a placeholder, and calling
        # one raises a bare RuntimeError() that says nothing.
        return (
            "an imported name was called while the config loaded; in a .py config imports are "
            "placeholders (mmengine lazy import) and cannot be called; use plain values"
        )
    return _one_line(exc)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[-1].strip() if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _where_in_config(exc: BaseException, path: str) -> str:
    """``file:line`` of the deepest traceback frame in user code (not orchestra, not installed packages)."""
    import traceback

    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the orchestra package
    where = path
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if "site-packages" in name or name.startswith("<") or os.path.abspath(name).startswith(own):
            continue
        where = f"{os.path.relpath(name)}:{frame.lineno}"
    return where


def to_plain(obj: Any) -> Any:
    """Plain containers with classes replaced by their dotted import paths."""
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    if callable(obj) and hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
        return f"{obj.__module__}.{obj.__qualname__}"
    return obj


