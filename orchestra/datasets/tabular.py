"""Datasets read from tabular files: Arrow / Parquet (``ArrowDataset``) and CSV (``CsvDataset``).

Rows are plain dicts keyed by column name; nested Arrow types become lists and dicts.
pyarrow is imported only when rows are read.
"""

from __future__ import annotations

import codecs
import csv
import glob
import json
import os
from typing import Any

from orchestra.datasets.base import BaseDataset
from orchestra.datasets.digest import files_stamp, stamped_key
from orchestra.errors import ConfigError

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".parquet")
COLUMN_TYPES = ("str", "int", "float", "bool", "json")
#: The largest CSV cell read (Python's default, 128 KiB, refused a long context as an error).
CSV_FIELD_LIMIT = 2**31 - 1


def arrow_files(path: str) -> list[str]:
    """The data files behind ``path``: the file itself, or a folder's ``*.arrow`` / ``*.parquet``
    files in name order (the layout ``datasets.Dataset.save_to_disk`` writes)."""
    if os.path.isdir(path):
        found = sorted(f for suffix in (".arrow", ".parquet") for f in glob.glob(os.path.join(path, f"*{suffix}")))
        return found
    return [path]


def read_arrow(path: str) -> list[dict[str, Any]]:
    """Every row of an Arrow IPC (stream or file format) or Parquet file, or of a folder of them."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    for file in arrow_files(path):
        if file.endswith(".parquet"):
            import pyarrow.parquet as pq

            table = pq.read_table(file)
        else:
            source = pa.memory_map(file)
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
        rows.extend(table.to_pylist())
    return rows


class ArrowDataset(BaseDataset):
    """Rows of an Arrow IPC file (``.arrow``, stream or file format), a Parquet file, or a
    folder of ``data-*.arrow`` shards as written by ``datasets.Dataset.save_to_disk``.

    Args:
        columns: keep only these columns (all when ``None``).
    """

    def __init__(
        self,
        abbr: str,
        path: str,
        reader_cfg: dict,
        infer_cfg: dict,
        eval_cfg: dict | None = None,
        columns: list | None = None,
    ) -> None:
        super().__init__(abbr, path, reader_cfg, infer_cfg, eval_cfg)
        self.columns_kept = list(columns) if columns is not None else None

    def load_rows(self) -> list[dict[str, Any]]:
        where = f"dataset {self.abbr}"
        path = os.path.expanduser(self.path)
        if not os.path.exists(path):
            raise ConfigError(f"{where}: {self.path} does not exist")
        if os.path.isdir(path) and not arrow_files(path):
            raise ConfigError(f"{where}: folder {self.path} holds no .arrow or .parquet file")
        try:
            rows = read_arrow(path)
        except Exception as exc:  # pyarrow raises several unrelated types for a bad file
            raise ConfigError(f"{where}: {self.path} is not a readable Arrow/Parquet file ({exc})") from None
        if self.columns_kept is not None:
            have = set(rows[0]) if rows else set(self.columns_kept)
            missing = [c for c in self.columns_kept if c not in have]
            if missing:
                raise ConfigError(
                    f"{where}: columns: {missing[0]!r} not in {self.path}; columns are: {', '.join(sorted(have))}"
                )
            rows = [{c: r[c] for c in self.columns_kept} for r in rows]
        return rows

    def content_key(self) -> str:
        path = os.path.expanduser(self.path)
        files = arrow_files(path) if os.path.isdir(path) else [path]
        return stamped_key(type(self).__name__, [files_stamp(files), self.columns_kept], self.reader_cfg)


def _convert(value: str, kind: str) -> Any:
    if kind == "str":
        return value
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        low = value.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return json.loads(value)


class CsvDataset(BaseDataset):
    """Rows of a CSV file with a header line; every value is a string unless typed.

    Args:
        delimiter: field separator (``'\\t'`` for TSV).
        encoding: text encoding of the file (``'utf-8-sig'`` also strips a BOM).
        column_types: ``{column: 'str' | 'int' | 'float' | 'bool' | 'json'}``; ``json``
            parses a cell such as ``["red", "blue"]`` into a list (for ``choices_column``).
    """

    def __init__(
        self,
        abbr: str,
        path: str,
        reader_cfg: dict,
        infer_cfg: dict,
        eval_cfg: dict | None = None,
        delimiter: str = ",",
        encoding: str = "utf-8-sig",
        column_types: dict | None = None,
    ) -> None:
        super().__init__(abbr, path, reader_cfg, infer_cfg, eval_cfg)
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '"\r\n':
            raise ConfigError(f"dataset {abbr}: delimiter={delimiter!r} is not valid; give one character other "
                              "than a quote or a line break (',', ';', '\\t', '|')")
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise ConfigError(f"dataset {abbr}: encoding={encoding!r} is not a known text encoding; "
                              "give one such as 'utf-8-sig', 'utf-8', 'latin-1' or 'cp1252'") from None
        self.delimiter = delimiter
        self.encoding = encoding
        self.column_types = dict(column_types or {})
        bad = {c: t for c, t in self.column_types.items() if t not in COLUMN_TYPES}
        if bad:
            col, kind = next(iter(bad.items()))
            raise ConfigError(
                f"dataset {abbr}: column_types[{col!r}]={kind!r} is not valid; valid: {', '.join(COLUMN_TYPES)}"
            )

    def load_rows(self) -> list[dict[str, Any]]:
        try:
            return self._read_csv()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"dataset {self.abbr}: {self.path} is not valid {self.encoding} (byte {exc.start}); "
                              "save it in that encoding or set encoding=...") from None

    def _read_csv(self) -> list[dict[str, Any]]:
        where = f"dataset {self.abbr}"
        path = os.path.expanduser(self.path)
        if not os.path.isfile(path):
            raise ConfigError(f"{where}: {self.path} does not exist")
        csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
        with open(path, newline="", encoding=self.encoding) as fh:
            reader = csv.DictReader(fh, delimiter=self.delimiter)
            header = reader.fieldnames or []
            missing = [c for c in self.column_types if c not in header]
            if missing:
                raise ConfigError(
                    f"{where}: column_types names {missing[0]!r}, not a column of {self.path}; "
                    f"columns are: {', '.join(header)}"
                )
            rows: list[dict[str, Any]] = []
            for line_no, raw in enumerate(reader, start=2):
                if None in raw:
                    raise ConfigError(f"{where}: {self.path} line {line_no} has more fields than the header")
                row: dict[str, Any] = dict(raw)
                for col, kind in self.column_types.items():
                    try:
                        row[col] = _convert(raw[col] or "", kind)
                    except (ValueError, RecursionError) as exc:  # json: too deeply nested
                        raise ConfigError(
                            f"{where}: {self.path} line {line_no}, column {col!r}: cannot read as {kind} ({exc})"
                        ) from None
                rows.append(row)
        return rows

    def content_key(self) -> str:
        opts = [self.delimiter, self.encoding, sorted(self.column_types.items())]
        return stamped_key(type(self).__name__, [files_stamp([os.path.expanduser(self.path)]), opts], self.reader_cfg)
