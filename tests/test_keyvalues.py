"""``orchestra.keyvalues``: a hand-written settings file read as data, never executed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.keyvalues import MAX_BYTES, read_key_values


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
                               "(a string, number, bool, None, list or dict; each line is NAME = a Python "
                               "literal: quote text, as in name = 'value'; or use a .json or .yaml file)")
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


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO planted at the path (nobody writes it) is one line at once; before, ``open`` blocked
    for ever.  Run in a child process so that a regression fails on its timeout, never hangs."""
    fifo = tmp_path / "aliyun.cfg"
    os.mkfifo(fifo)
    code = "import sys\nfrom orchestra.keyvalues import read_key_values\ntry:\n" \
           f"    read_key_values({str(fifo)!r}, 'aliyun config')\nexcept ValueError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == f"{fifo}: the aliyun config is not a regular file", out.stderr


def test_a_huge_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.cfg"
    path.write_text("x = '" + "a" * MAX_BYTES + "'\n")
    with pytest.raises(ValueError, match=f"big.cfg: the aliyun config is larger than {MAX_BYTES} bytes"):
        read_key_values(str(path), "aliyun config")


def test_yaml_aliases_are_refused(tmp_path: Path) -> None:
    """Nine lines of aliases would be 10**9 values for whoever walks the result (billion laughs)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"laughs.yaml: not valid YAML: aliases \(\*name\) are not allowed"):
        read_key_values(str(path), "aliyun config")


def test_yaml_python_tags_construct_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "tag.yaml"
    path.write_text(f"a: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        read_key_values(str(path), "aliyun config")
    assert not marker.exists()


@pytest.mark.parametrize("name", ["deep.json", "deep.yaml", "deep.cfg"])
def test_deep_nesting_is_one_line_not_a_traceback(tmp_path: Path, name: str) -> None:
    """A JSON array nested 100000 deep raised RecursionError (a traceback at the CLI) before."""
    path = tmp_path / name
    inner = "[" * 100_000 + "]" * 100_000
    path.write_text({"deep.json": '{"x": %s}', "deep.yaml": "x: %s\n", "deep.cfg": "x = %s\n"}[name] % inner)
    with pytest.raises(ValueError) as info:
        read_key_values(str(path), "aliyun config")
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


@pytest.mark.parametrize("value", ["dict(a=1, **other)", "dict(a=1, **{'b': 2})"])
def test_dict_with_double_star_is_refused_not_dropped(tmp_path: Path, value: str) -> None:
    """``**other`` names another value (a name is refused everywhere else); it was silently dropped."""
    path = tmp_path / "s.cfg"
    path.write_text(f"x = {value}\n")
    with pytest.raises(ValueError, match=r"s.cfg:1: the value of 'x' is not a plain value"):
        read_key_values(str(path), "aliyun config")


@pytest.mark.parametrize("value", ["-" * 100_000 + "1", "1+" * 100_000 + "1"])
def test_an_expression_too_deep_for_the_parser_is_one_line(tmp_path: Path, value: str) -> None:
    """Brackets stop at the tokenizer's limit (a syntax error); a long chain of operators reaches
    the parser's recursion limit instead, which ``ast.parse`` raises as RecursionError."""
    path = tmp_path / "deep.cfg"
    path.write_text(f"x = {value}\n")
    with pytest.raises(ValueError) as info:
        read_key_values(str(path), "aliyun config")
    assert str(info.value) == f"{path}: nested too deeply to read"
