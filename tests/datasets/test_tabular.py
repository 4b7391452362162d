"""ArrowDataset and CsvDataset on real files written in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra.datasets.tabular import ArrowDataset, CsvDataset
from orchestra.errors import ConfigError
from tests.helpers import jsonl, run_cli, run_dirs

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


def write_csv_config(tmp_path: Path, data: Path, **csv_kw: str) -> Path:
    """A config that evaluates the demo model on one CsvDataset (``csv_kw``: its options)."""
    opts = "".join(f", {k}={v!r}" for k, v in csv_kw.items())
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets import CsvDataset\n"
        "from orchestra.models import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='m')]\n"
        f"datasets = [dict(type=CsvDataset, abbr='t', path={str(data)!r}{opts},\n"
        "                 reader_cfg=dict(input_columns=['question'], output_column='label'),\n"
        "                 infer_cfg=dict(prompt_template='{question}'),\n"
        "                 eval_cfg=dict(evaluator='exact_match'))]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n"
    )
    return cfg


def test_csv_cell_larger_than_the_csv_modules_default_limit_is_read(tmp_path: Path) -> None:
    """A long cell (a whole source file as context, say) is data like any other: Python's csv
    module refuses fields over 128 KiB by default, which ended the run with a traceback."""
    long_question = "Explain this code:\n" + "x = 1\n" * 40000  # 240 KB in one quoted cell
    path = tmp_path / "long.csv"
    path.write_text('question,label\n"' + long_question + '",1\nshort,2\n', encoding="utf-8")
    ds = CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg={})
    assert ds.all_rows() == [{"question": long_question, "label": "1"}, {"question": "short", "label": "2"}]
    res = run_cli(write_csv_config(tmp_path, path), timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    run = run_dirs(tmp_path / "out")[-1]
    records = [r for r in jsonl(run / "predictions" / "m" / "t.jsonl") if "id" in r]
    assert [(r["id"], r["prompt"]) for r in records] == [(0, long_question), (1, "short")]


@pytest.mark.parametrize(("option", "value", "fragment"), [
    ("delimiter", "||", "delimiter='||' is not valid; give one character"),
    ("delimiter", "", "delimiter='' is not valid; give one character"),
    ("delimiter", '"', "delimiter='\"' is not valid"),
    ("encoding", "utf-9", "encoding='utf-9' is not a known text encoding"),
])
def test_bad_csv_option_is_one_line_naming_dataset_and_value(tmp_path: Path, option: str, value: str,
                                                             fragment: str) -> None:
    """A CSV option Python's csv module or codecs refuse: exit 2 with one line, not a traceback."""
    path = tmp_path / "d.csv"
    path.write_text("question,label\nq,1\n")
    res = run_cli(write_csv_config(tmp_path, path, **{option: value}), "--dry-run")
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert fragment in lines[0] and "datasets[0]" in lines[0], lines[0]


def test_a_json_cell_nested_too_deeply_names_line_and_column(tmp_path: Path) -> None:
    """A ``json`` cell 100,000 lists deep: Python's parser raises ``RecursionError``, which
    escaped as a traceback; now a ConfigError naming the file, line and column."""
    path = tmp_path / "d.csv"
    path.write_text('question,choices\nq,"[1]"\nq,"' + "[" * 100_000 + "]" * 100_000 + '"\n')
    ds = CsvDataset(abbr="c", path=str(path), reader_cfg=READER, infer_cfg={}, column_types=dict(choices="json"))
    with pytest.raises(ConfigError) as exc:
        ds.all_rows()
    assert str(path) in str(exc.value) and "line 3, column 'choices': cannot read as json" in str(exc.value)
