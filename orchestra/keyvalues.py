"""Read a small settings file of keys and values, never executing it.

Some tools keep their settings in a file a user writes by hand (OpenCompass's ``~/.aliyun.cfg``
for DLC is the case in point): JSON, YAML, or Python-looking ``NAME = value`` lines.  Such a file
is data, so a ``.py``-style one is parsed with :mod:`ast` and only plain literals are accepted
(strings, numbers, bools, None, lists, tuples, dicts, and ``dict(key=literal, ...)``); a call, a
name, an import or any other statement is refused.  The file is read only if it is a regular
file of at most :data:`MAX_BYTES` (a FIFO or a device would block or never end), and a YAML file
may not use aliases (``*name``: a few lines of them expand to a billion values).  Every problem is
one ``ValueError`` line that names the file (and the line, where there is one).
"""

from __future__ import annotations

import ast
import json
import math
import os
import stat
import sys
from typing import Any

#: the largest settings file read (a hand-written file of keys and values is a few hundred bytes)
MAX_BYTES = 1 << 20


def read_key_values(path: str, what: str) -> dict[str, Any]:
    """The keys and values of the file at ``path`` (``~`` expanded), chosen by its extension:
    ``.json``, ``.yaml``/``.yml``, anything else ``NAME = literal`` lines.  Keys starting with ``_``
    are dropped.  ``what`` names the file's role in errors (``"aliyun config"``)."""
    full = os.path.expanduser(path)
    text = _read_text(full, path, what)
    ext = os.path.splitext(full)[1]
    if ext == ".json":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    elif ext in (".yaml", ".yml"):
        data = _yaml(text, path)
    else:
        data = python_literals(text, path, what)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an {what} holds keys and values, got {type(data).__name__}")
    out = {str(k): v for k, v in data.items() if not str(k).startswith("_")}
    bad = non_finite(out)
    if bad is not None:  # JSON's NaN/Infinity, YAML's .nan/.inf, a literal 1e999
        raise ValueError(f"{path}: {bad[0]}: expected a finite number, got {bad[1]!r} ({NON_FINITE})")
    return out


#: why a NaN or an infinity is refused, for the errors that say so
NON_FINITE = "NaN and infinity are refused in every setting; a limit that can be lifted takes None"


#: the largest finite float; an integer beyond it (``10**400``) is infinite as a setting
_FLOAT_MAX = sys.float_info.max


def non_finite(value: Any) -> tuple[str, float] | None:
    """The first float in ``value`` (dicts, lists and tuples, nested) that is NaN or infinite (or
    an integer too large for a float, given as the infinity of its sign), with
    where it is (``batch.poll_s``, ``k[2]``); None when every number is finite.

    A setting is never NaN (every comparison with it is false, so a check such as ``poll_s > 0``
    lets it through) and never infinite (a wait of ``inf`` seconds never ends): settings that can
    mean "no limit" say so with None.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # depth-first, in document order, without recursion (a config may nest deeply)
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where, item
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > _FLOAT_MAX:
            return where, math.inf if item > 0 else -math.inf  # no float holds it: every use of it overflows
        if isinstance(item, dict):
            children = [(f"{where}.{k}" if where else str(k), v) for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            children = [(f"{where}[{i}]", v) for i, v in enumerate(item)]
        else:
            continue
        stack.extend(reversed(children))
    return None


def _read_text(full: str, path: str, what: str) -> str:
    """The text of the regular file ``full``, at most :data:`MAX_BYTES`; opened without blocking, so
    a FIFO or a device at the path is refused, never waited on."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError(f"{path}: the {what} is not a regular file")
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ValueError(f"{path}: the {what} is larger than {MAX_BYTES} bytes")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the {what}: {exc}") from None


def _yaml(text: str, path: str) -> Any:
    """``yaml.safe_load`` that refuses aliases (``*name``), which can expand a small file to
    billions of values."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", mark)
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader, aliases refused too
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


#: how a ``key = value`` file is written, for its errors (an unquoted ``image = repo/name:1`` is the
#: usual mistake of someone who expects shell-style lines)
_FORMAT = "each line is NAME = a Python literal: quote text, as in name = 'value'; or use a .json or .yaml file"


def python_literals(text: str, path: str, what: str) -> dict[str, Any]:
    """``NAME = literal`` assignments of a Python-looking text (a docstring allowed), by name."""
    try:
        tree = ast.parse(text, path)
    except SyntaxError as exc:
        raise ValueError(f"{path}:{exc.lineno}: syntax error: {exc.msg} ({_FORMAT})") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"{path}: nested too deeply to read") from None
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ValueError(f"{path}:{node.lineno}: only 'key = value' lines are allowed in an {what}")
        try:
            out[node.targets[0].id] = _literal(node.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise ValueError(f"{path}:{node.lineno}: the value of {node.targets[0].id!r} is not a plain value "
                             f"(a string, number, bool, None, list or dict; {_FORMAT})") from None
    return out


def _literal(node: ast.AST) -> Any:
    """``ast.literal_eval``, plus ``dict(key=literal, ...)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        if any(kw.arg is None for kw in node.keywords):  # dict(**name): a name, not a value
            raise ValueError("dict(**...) is not a plain value")
        return {kw.arg: _literal(kw.value) for kw in node.keywords}
    return ast.literal_eval(node)
