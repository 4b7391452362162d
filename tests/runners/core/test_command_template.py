"""Templates are filled per argument, and hostile values survive as one argument.

Every quoting claim is proved by executing the filled argv (or ``Command.display()`` through
``bash -c``) with a real subprocess that prints the argv it received.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestra.errors import ConfigError
from orchestra.runners.core.command import Command, fill_template, template_fields
from orchestra.runners.local.runner import LocalRunner
from orchestra.tasks.spec import TaskSpec

BASH = shutil.which("bash") or "/bin/bash"

ECHO_ARGV = "import sys, json, os; print(json.dumps({'argv': sys.argv[1:], 'foo': os.environ.get('FOO')}))"


def hostile(tmp_path: Path) -> list[str]:
    """Values a shell would split, expand or run, if anything ever handed them to one."""
    marker = tmp_path / "pwned"
    return [
        "two words",
        "  leading and trailing  ",
        "it's",
        'say "hi"',
        "both ' and \"",
        "a; touch " + str(marker),
        "$(touch " + str(marker) + ")",
        "`touch " + str(marker) + "`",
        "line1\nline2",
        "tab\there",
        "$HOME ~ * ?",
        "back\\slash",
        "&& || | > <",
        "{task_id} {nope}",  # braces in a value are data, never a field
        "",
        "-",
        "--flag=a b",
        "ünïcödé",
    ]


def task_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", ECHO_ARGV, *args]


def run(argv: list[str] | tuple[str, ...], env: dict[str, str] | None = None) -> dict[str, Any]:
    import os

    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True,
                          env={**os.environ, **(env or {})})
    return json.loads(proc.stdout)


def run_display(cmd: Command) -> dict[str, Any]:
    proc = subprocess.run([BASH, "-c", cmd.display()], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------------------
# filling


def test_task_cmd_as_whole_argument_expands_to_argv() -> None:
    argv = fill_template("nice -n 5 {task_cmd}", ["python", "-m", "x", "a b"], {})
    assert argv == ["nice", "-n", "5", "python", "-m", "x", "a b"]
    # also in the middle, with arguments after it
    argv = fill_template("wrap {task_cmd} --after", ["p", "q"], {})
    assert argv == ["wrap", "p", "q", "--after"]


def test_field_inside_an_argument() -> None:
    argv = fill_template("srun --job-name=orc-{task_id} --gres=gpu:{num_gpus} {task_cmd}", ["p"],
                         {"task_id": "infer_m_d", "num_gpus": 2})
    assert argv == ["srun", "--job-name=orc-infer_m_d", "--gres=gpu:2", "p"]


def test_string_template_is_split_with_shell_rules() -> None:
    argv = fill_template("""srun --comment "a b" --x='c d' e\\ f {task_cmd}""", ["p"], {})
    assert argv == ["srun", "--comment", "a b", "--x=c d", "e f", "p"]


def test_list_template_is_not_split() -> None:
    argv = fill_template(["srun", "--comment=a b {task_id}", "{task_cmd}"], ["p", "q r"], {"task_id": "t 1"})
    assert argv == ["srun", "--comment=a b t 1", "p", "q r"]


def test_task_cmd_inside_an_argument_is_one_quoted_string() -> None:
    argv = fill_template("sbatch --wrap={task_cmd}", ["python", "a b", "it's"], {})
    assert argv == ["sbatch", "--wrap=python 'a b' 'it'\"'\"'s'"]


@pytest.mark.parametrize("template", ["bash -c '{task_cmd}'", 'bash -c "{task_cmd}"', ["bash", "-c", "{task_cmd}"]])
def test_quoted_task_cmd_for_a_shell(template: Any, tmp_path: Path) -> None:
    """``bash -c '{task_cmd}'``: the shell gets one string and runs exactly the task's argv."""
    values = hostile(tmp_path)
    argv = fill_template(template, task_cmd(*values), {})
    if isinstance(template, list):
        # a list template is taken literally: {task_cmd} as a whole item is the argv itself,
        # so bash -c gets the interpreter as its script; the string forms are what a user wants
        assert argv[:3] == ["bash", "-c", sys.executable]
        return
    assert len(argv) == 3 and argv[:2] == ["bash", "-c"]
    assert run(argv)["argv"] == values
    assert not (tmp_path / "pwned").exists()


def test_hostile_field_values_stay_one_argument(tmp_path: Path) -> None:
    values = hostile(tmp_path)
    for value in values:
        argv = fill_template("env FOO={task_id} {task_cmd}", task_cmd(value, "--last"), {"task_id": value})
        assert argv[:2] == ["env", f"FOO={value}"]
        out = run(argv)
        assert out == {"argv": [value, "--last"], "foo": value}
    assert not (tmp_path / "pwned").exists()


def test_hostile_task_argv_survives_execution(tmp_path: Path) -> None:
    values = hostile(tmp_path)
    argv = fill_template("env FOO={task_id} {task_cmd}", task_cmd(*values), {"task_id": "x; y"})
    assert run(argv) == {"argv": values, "foo": "x; y"}
    assert not (tmp_path / "pwned").exists()


def test_display_round_trips_through_bash(tmp_path: Path) -> None:
    values = hostile(tmp_path)
    argv = fill_template("env FOO={task_id} {task_cmd}", task_cmd(*values), {"task_id": values[6]})
    cmd = Command(tuple(argv), {"ORCHESTRA_X": "a b; c"})
    assert run_display(cmd) == {"argv": values, "foo": values[6]}
    # environment additions are displayed as assignments that bash applies
    env_cmd = Command(tuple(task_cmd("x")), {"FOO": "it's $(touch " + str(tmp_path / "pwned") + ")\nnext"})
    assert run_display(env_cmd)["foo"] == env_cmd.env["FOO"]
    assert not (tmp_path / "pwned").exists()


def test_display_is_stable_and_sorted() -> None:
    cmd = Command(("a", "b c"), {"Z": "1", "A": "x y"})
    assert cmd.display() == "A='x y' Z=1 a 'b c'"
    assert Command(("a",)).display() == "a"


# --------------------------------------------------------------------------------------
# errors


def test_unknown_field_is_a_config_error_listing_valid_fields() -> None:
    with pytest.raises(ConfigError, match=r"unknown field \{partition\}; valid: num_gpus, task_cmd, task_id"):
        fill_template("srun -p {partition} {task_cmd}", ["p"], {"task_id": "t", "num_gpus": 1})


@pytest.mark.parametrize("template", ["srun -p x", "srun --wrap=task_cmd", ["srun"], "{task_id}"])
def test_template_without_task_cmd(template: Any) -> None:
    with pytest.raises(ConfigError, match=r"must contain \{task_cmd\}"):
        fill_template(template, ["p"], {"task_id": "t"})


@pytest.mark.parametrize(("template", "fragment"), [
    ("srun 'oops {task_cmd}", "No closing quotation"),
    ("srun {task_cmd", "expected '}'"),
    ("srun {0} {task_cmd}", "{0} in '{0}' is not a field name"),
    ("srun {} {task_cmd}", "is not a field name"),
    ("srun {task_id.upper} {task_cmd}", "{task_id.upper} in '{task_id.upper}' is not a field name"),
    ("srun {task_id[0]} {task_cmd}", "is not a field name"),
    ("srun {task_id:d} {task_cmd}", "cannot fill"),
    (["srun", 3, "{task_cmd}"], "expected a string or a list of strings"),
    (42, "expected a string or a list of strings"),
])
def test_malformed_templates_are_config_errors(template: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        fill_template(template, ["p"], {"task_id": "t"})
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_literal_braces_are_escaped_by_doubling() -> None:
    assert fill_template("echo {{x}} {task_cmd}", ["p"], {}) == ["echo", "{x}", "p"]


def test_template_fields() -> None:
    assert template_fields("srun -p {partition} --x={task_id}-{stage} {task_cmd}") == {
        "partition", "task_id", "stage", "task_cmd"}
    assert template_fields("bash -c '{task_cmd}'") == {"task_cmd"}


# --------------------------------------------------------------------------------------
# through a runner


def spec(task_id: str) -> TaskSpec:
    return TaskSpec(stage="infer", task_id=task_id, run_dir="/r", model={"abbr": "m"}, model_abbr="m", units=())


def test_runner_wraps_the_task_command(tmp_path: Path) -> None:
    runner = LocalRunner(template="env FOO={task_id}:{gpu_ids} {task_cmd}", gpus=[])
    cmd = runner.get_command(spec("infer_m_a b"), str(tmp_path / "spec dir" / "t.py"), {"gpu_ids": []}, 1,
                             str(tmp_path / "t.log"))
    assert cmd.argv[:2] == ("env", "FOO=infer_m_a b:")
    assert cmd.argv[2:] == (sys.executable, "-m", "orchestra.tasks.infer", str(tmp_path / "spec dir" / "t.py"))
    assert cmd.env["ORCHESTRA_TASK_ID"] == "infer_m_a b"
    assert "'FOO=infer_m_a b:'" in cmd.display()


@pytest.mark.parametrize(("template", "fragment"), [
    ("srun {partition} {task_cmd}", "unknown field {partition}"),
    ("numactl -N 0", "must contain {task_cmd}"),
])
def test_runner_rejects_bad_template_at_construction(template: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("{", r"\{").replace("}", r"\}")):
        LocalRunner(template=template, gpus=[])
