"""ArrowDataset and CsvDataset on real files written in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra.datasets.tabular import ArrowDataset, CsvDataset
from orchestra.errors import ConfigError

pa = pytest.importorskip("pyarrow")

ROWS = [
    {"question": "2+2?", "choices": ["3", "4"], "label": 1},
    {"question": "Sky?", "choices": ["blue", "green"], "label": 0},
]
READER = dict(input_columns=["question"], output_column="label")
INFER = dict(prompt_template="{question}", inferencer=dict(type="loglik", choices_column="choices"))


def arrow(path: Path, **kw: object) -> ArrowDataset:
    return ArrowDataset(abbr="t", path=str(path), reader_cfg=READER, infer_cfg=INFER, **kw)  # type: ignore[arg-type]


def write_stream(path: Path, rows: list[dict]) -> None:
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def test_arrow_stream_file_and_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    write_stream(tmp_path / "s.arrow", ROWS)
    table = pa.Table.from_pylist(ROWS)
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    pq.write_table(table, str(tmp_path / "p.parquet"))
    for name in ("s.arrow", "f.arrow", "p.parquet"):
        assert arrow(tmp_path / name).all_rows() == ROWS
    samples = arrow(tmp_path / "s.arrow").build_samples(0, 2)
    assert samples[0].loglik is not None and samples[0].loglik.continuations == (" 3", " 4")
    assert samples[0].gold == 1


def test_arrow_folder_of_shards(tmp_path: Path) -> None:
    write_stream(tmp_path / "data-00000-of-00002.arrow", ROWS[:1])
    write_stream(tmp_path / "data-00001-of-00002.arrow", ROWS[1:])
    ds = arrow(tmp_path)
    assert ds.all_rows() == ROWS
    key = ds.content_key()
    write_stream(tmp_path / "data-00001-of-00002.arrow", ROWS[1:] * 2)
    assert arrow(tmp_path).content_key() != key


def test_arrow_column_selection_and_errors(tmp_path: Path) -> None:
    write_stream(tmp_path / "s.arrow", ROWS)
    assert arrow(tmp_path / "s.arrow", columns=["label"]).all_rows() == [{"label": 1}, {"label": 0}]
    with pytest.raises(ConfigError, match="'nope' not in"):
        arrow(tmp_path / "s.arrow", columns=["nope"]).all_rows()
    with pytest.raises(ConfigError, match="does not exist"):
        arrow(tmp_path / "missing.arrow").all_rows()
    (tmp_path / "junk.arrow").write_text("not arrow")
    with pytest.raises(ConfigError, match="junk.arrow"):
        arrow(tmp_path / "junk.arrow").all_rows()


def test_csv_with_types(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('question,choices,label,ok\n"2+2, quickly?","[""3"", ""4""]",1,yes\nSky?,"[""blue""]",0,false\n')
    ds = CsvDataset(
        abbr="c",
        path=str(path),
        reader_cfg=READER,
        infer_cfg=INFER,
        column_types=dict(choices="json", label="int", ok="bool"),
    )
    assert ds.all_rows() == [
        {"question": "2+2, quickly?", "choices": ["3", "4"], "label": 1, "ok": True},
        {"question": "Sky?", "choices": ["blue"], "label": 0, "ok": False},
    ]
    plain = CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg=INFER)
    assert plain.all_rows()[0]["label"] == "1"
    assert plain.content_key() != ds.content_key()


def test_tsv(tmp_path: Path) -> None:
    path = tmp_path / "d.tsv"
    path.write_text("question\tlabel\nA, B\t1\n")
    ds = CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg={}, delimiter="\t")
    assert ds.all_rows() == [{"question": "A, B", "label": "1"}]


def test_csv_errors_name_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("question,label\nq1,1\nq2,two\n")
    with pytest.raises(ConfigError) as exc:
        CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg={}, column_types=dict(label="int")).all_rows()
    assert "line 3" in str(exc.value) and "'label'" in str(exc.value) and str(path) in str(exc.value)
    with pytest.raises(ConfigError, match="valid: str, int"):
        CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg={}, column_types=dict(label="decimal"))
    with pytest.raises(ConfigError, match="not a column"):
        CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg={}, column_types=dict(x="int")).all_rows()
    with pytest.raises(ConfigError, match="does not exist"):
        CsvDataset(abbr="c", path=str(tmp_path / "none.csv"), reader_cfg=READER, infer_cfg={}).all_rows()
