"""Datasets read from a JSON-lines file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from orchestra.datasets.base import BaseDataset
from orchestra.datasets.digest import shared_rows
from orchestra.errors import ConfigError
from orchestra.fileio import encodable, may_hold_surrogates


class JsonlDataset(BaseDataset):
    """One JSON object per line; each object is a row.  A lone surrogate escape in a string
    (``"\\ud800"``, valid JSON but not encodable text) is read as U+FFFD.

    Arguments are those of :class:`BaseDataset`; ``path`` is the ``.jsonl`` file.
    """

    def load_rows(self) -> list[dict[str, Any]]:
        path = os.path.expanduser(self.path)
        if not os.path.isfile(path):
            what = "is not a file" if os.path.exists(path) else "does not exist"
            raise ConfigError(f"dataset {self.abbr}: path {self.path!r} {what}")
        return shared_rows(path, "jsonl", self._read)

    def _read(self) -> list[dict[str, Any]]:
        rows = []
        scan = _SCAN
        with open(os.path.expanduser(self.path), "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError(f"{self.path}:{lineno}: not valid UTF-8 (byte {exc.start}); "
                                      "save the file as UTF-8") from None
                if not line.strip():
                    continue
                # json.loads(line) without its wrapper's cost (a fifth of the time over 1,000 rows;
                # 316 files of them are read to plan): its own C scanner over the line without the
                # whitespace JSON allows around a value; anything else is left to _row
                body = line.strip(_JSON_SPACE)
                try:
                    row, end = scan(body, 0)
                    whole = end == len(body) and type(row) is dict
                except (StopIteration, ValueError, RecursionError):
                    whole = False
                if not whole:
                    row = self._row(line, lineno)
                if may_hold_surrogates(line):  # "\ud800" alone: U+FFFD, or no prompt or output could be written
                    row = encodable(row)
                rows.append(row)
        return rows

    def _row(self, line: str, lineno: int) -> dict[str, Any]:
        """``line`` as a row, or a ``ConfigError`` that says why it is not one."""
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{self.path}:{lineno}: not valid JSON: {exc}") from None
        except RecursionError:  # valid JSON, but deeper than Python's parser goes
            raise ConfigError(f"{self.path}:{lineno}: not valid JSON here: nested too deeply for Python's "
                              "JSON parser") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{self.path}:{lineno}: a row must be a JSON object")
        return row


#: json.loads's own (C) scanner: ``(value, end)`` of the JSON value starting at an index
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"  # the whitespace JSON allows around a value (str.strip() strips more)
