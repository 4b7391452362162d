"""Read a config file (``.py`` with mmengine's ``read_base``, ``.yaml``, ``.json``) and apply
``--cfg-options`` overrides; every failure is one ``ConfigError`` line naming the file."""

from __future__ import annotations

import os
from typing import Any

from orchestra.errors import ConfigError


def load_config(path: str, cfg_options: list[str] | None = None) -> dict[str, Any]:
    """Read a ``.py`` / ``.yaml`` / ``.json`` config and apply ``a.b=value`` overrides."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found")
    ext = os.path.splitext(path)[1]
    if ext not in (".py", ".yaml", ".yml", ".json"):
        raise ConfigError(f"{path}: unsupported config type {ext!r}; use .py, .yaml or .json")
    from mmengine.config import Config, DictAction

    try:
        cfg = Config.fromfile(path)
    except SyntaxError as exc:
        line = f" line {exc.lineno}" if exc.lineno else ""
        raise ConfigError(f"{path}:{line} syntax error: {exc.msg}") from None
    except Exception as exc:  # mmengine wraps user-code errors in many types
        raise ConfigError(f"{_where_in_config(exc, path)}: cannot load config: {_load_problem(exc)}") from None
    if cfg_options:
        overrides: dict[str, Any] = {}
        for item in cfg_options:
            if "=" not in item:
                raise ConfigError(f"--cfg-options {item!r}: expected KEY=VALUE")
            key, value = item.split("=", 1)
            overrides[key] = DictAction._parse_iterable(value)
        try:
            cfg.merge_from_dict(overrides)
        except Exception as exc:
            raise ConfigError(f"--cfg-options: {exc}") from None
    return to_plain(cfg.to_dict())


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


