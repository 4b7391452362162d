"""JsonlDataset on hostile files written by someone else, through the real command line."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import jsonl, run_cli, run_dirs


def jsonl_config(tmp_path: Path, data: Path) -> Path:
    """A config that evaluates the demo model on one JsonlDataset read from ``data``."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets import JsonlDataset\n"
        "from orchestra.models import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='m')]\n"
        f"datasets = [dict(type=JsonlDataset, abbr='t', path={str(data)!r},\n"
        "                 reader_cfg=dict(input_columns=['question'], output_column='answer'),\n"
        "                 infer_cfg=dict(prompt_template='{question}'))]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n"
    )
    return cfg


def assert_one_line(res: object, *fragments: str) -> None:
    rc, stderr = res.returncode, res.stderr
    assert rc == 2 and "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestra: error: "), stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_row_nested_deeper_than_the_json_parser_goes_is_one_line_naming_the_line(tmp_path: Path) -> None:
    """``{"question": [[[[...]]]]}`` 100,000 deep is valid JSON that Python's parser cannot read
    (``RecursionError``): it ended --dry-run and every run with a traceback."""
    data = tmp_path / "deep.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n{"question": ' + "[" * 100_000 + "]" * 100_000
                    + ', "answer": "a"}\n')
    for args in (["--dry-run"], []):
        res = run_cli(jsonl_config(tmp_path, data), *args)
        assert_one_line(res, f"{data}:2: ", "nested too deeply")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("predictions"))


def test_a_path_under_the_home_folder_written_with_a_tilde_is_read(tmp_path: Path) -> None:
    """``path='~/data.jsonl'`` works as it does for CsvDataset and ArrowDataset (and as the
    content key already read it); JsonlDataset said the file did not exist."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "data.jsonl").write_text('{"question": "Say 7", "answer": "7"}\n')
    cfg = jsonl_config(tmp_path, Path("~/data.jsonl"))
    env = {**os.environ, "HOME": str(home), "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    res = run_cli(cfg, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert [r["prediction"] for r in jsonl(run / "predictions" / "m" / "t.jsonl") if "id" in r] == ["7"]
    folder = run_cli(jsonl_config(tmp_path, Path("~")), "--dry-run", env=env)
    assert_one_line(folder, "path '~' is not a file")


#: lines the reader's quick scan must read exactly as ``json.loads`` does, or leave to it
_ODD_LINES = ['{"question": "a", "answer": "1"}', '  \t{"question": "b", "answer": "2"}  \r', '',
              '{"question": NaN, "answer": Infinity}', '\x0b', '{"question": "\\u00e9\\ud83d\\ude00", "answer": "é"}',
              '{"question": "q", "answer": "x", "question": "dup"}', '   ', '{"question": 1e400, "answer": -0}']


def test_rows_are_what_json_loads_reads_of_each_line(tmp_path: Path) -> None:
    """The quick scan of each line (json's C scanner without json.loads's wrapper) gives the
    rows json.loads gives: whitespace JSON allows around a value, blank lines skipped, NaN, a
    duplicate key, escapes; a lone surrogate escape is still read as U+FFFD."""
    import json

    from orchestra.datasets import JsonlDataset

    data = tmp_path / "odd.jsonl"
    data.write_bytes("\n".join([*_ODD_LINES, '{"question": "\\ud800", "answer": "s"}']).encode())
    rows = JsonlDataset(abbr="t", path=str(data), reader_cfg=dict(input_columns=["question"],
                                                                  output_column="answer"),
                         infer_cfg=dict(prompt_template="{question}")).load_rows()
    expected = [json.loads(line) for line in _ODD_LINES if line.strip()]
    assert repr(rows[:-1]) == repr(expected)  # repr: NaN != NaN
    assert rows[-1] == {"question": "\ufffd", "answer": "s"}


def test_a_line_that_is_no_row_is_one_line_naming_it_as_before(tmp_path: Path) -> None:
    """Lines the quick scan refuses go to json.loads, whose words name the line: two objects on
    one line, a value that is not an object, a byte order mark, a space JSON does not allow."""
    cases = {'{"question": "a", "answer": "1"} {"question": "b"}': "not valid JSON: Extra data",
             '["question", "answer"]': "a row must be a JSON object",
             '\ufeff{"question": "a", "answer": "1"}': "not valid JSON: Unexpected UTF-8 BOM",
             '\u00a0{"question": "a", "answer": "1"}': "not valid JSON: Expecting value"}
    for n, (line, words) in enumerate(cases.items()):
        data = tmp_path / f"bad{n}.jsonl"
        data.write_text('{"question": "q", "answer": "a"}\n' + line + "\n", encoding="utf-8")
        assert_one_line(run_cli(jsonl_config(tmp_path, data), "--dry-run"), f"{data}:2: {words}")
