"""``orchestra.keyvalues``: a hand-written settings file read as data, never executed."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra.keyvalues import read_key_values


def test_python_style_lines_give_their_literals(tmp_path: Path) -> None:
    path = tmp_path / "settings.cfg"
    path.write_text('"""A docstring."""\nname = "x"\ncount = 3\nflags = [True, None]\n'
                    'nested = dict(a=1, b=dict(c="d"))\n_private = 1\n')
    assert read_key_values(str(path), "example config") == {
        "name": "x", "count": 3, "flags": [True, None], "nested": {"a": 1, "b": {"c": "d"}}}


def test_json_and_yaml_by_extension(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"k": [1, 2], "_hidden": 0}')
    (tmp_path / "a.yaml").write_text("k: [1, 2]\n")
    (tmp_path / "b.yml").write_text("k: {x: 1}\n")
    assert read_key_values(str(tmp_path / "a.json"), "x") == {"k": [1, 2]}
    assert read_key_values(str(tmp_path / "a.yaml"), "x") == {"k": [1, 2]}
    assert read_key_values(str(tmp_path / "b.yml"), "x") == {"k": {"x": 1}}


def test_code_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.cfg"
    path.write_text(f"x = 1\ny = __import__('os').system('touch {marker}')\n")
    with pytest.raises(ValueError) as info:
        read_key_values(str(path), "example config")
    assert str(info.value) == (f"{path}:2: the value of 'y' is not a plain value "
                               "(a string, number, bool, None, list or dict)")
    path.write_text(f"import os\nos.system('touch {marker}')\n")
    with pytest.raises(ValueError, match=r":1: only 'key = value' lines are allowed in an example config"):
        read_key_values(str(path), "example config")
    assert not marker.exists()


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.cfg", "x = (\n", ":1: syntax error"),
    ("bad.json", "{", "not valid JSON"),
    ("bad.yaml", "a: [\n", "not valid YAML"),
    ("list.json", "[1]", "an aliyun config holds keys and values, got list"),
])
def test_each_problem_is_one_line_naming_the_file(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        read_key_values(str(path), "aliyun config")
    assert str(info.value).startswith(str(path)) and message in str(info.value) and "\n" not in str(info.value)


def test_a_missing_file_names_its_role(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the aliyun config"):
        read_key_values(str(tmp_path / "nope.cfg"), "aliyun config")
