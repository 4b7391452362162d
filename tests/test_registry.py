"""``Registry.resolve``: a config's ``type`` to a class, with real imports of modules written by
the tests (on ``sys.path``), and the CLI's one line when a user's module cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra.errors import ConfigError
from orchestra.models.fake import DeterministicModel
from orchestra.registry import MODELS, NOT_BY_NAME, Registry, dotted_name, import_dotted

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A folder on ``sys.path`` for the test's own modules, removed (with the modules) after."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            if name.startswith("regtest_"):
                del sys.modules[name]


def test_names_classes_and_dotted_paths_resolve(modules: Path) -> None:
    (modules / "regtest_models.py").write_text(
        "from orchestra.models.fake import DeterministicModel\n\n\n"
        "class Outer:\n    class Inner(DeterministicModel):\n        pass\n")
    assert MODELS.resolve("DeterministicModel", "m") is DeterministicModel
    assert MODELS.resolve(DeterministicModel, "m") is DeterministicModel  # a class given in a Python config
    assert MODELS.resolve("orchestra.models.fake:DeterministicModel", "m") is DeterministicModel
    inner = MODELS.resolve("regtest_models.Outer.Inner", "m")
    assert inner.__qualname__ == "Outer.Inner" and dotted_name(inner) == "regtest_models.Outer.Inner"
    assert import_dotted(dotted_name(inner)) is inner


@pytest.mark.parametrize(("spec", "says"), [
    (3, "models[0]: type must be a class or a name, got 3"),
    ("", "models[0]: type must be a class or a name, got ''"),
    ("Deterministic", "models[0]: unknown model type 'Deterministic'; valid: AnthropicAPI, DeterministicModel"),
    ("orchestra.models.fake.NoSuchModel", "unknown model type 'orchestra.models.fake.NoSuchModel'"),
    ("no_such_package_xyz.Model", "unknown model type 'no_such_package_xyz.Model'"),
    ("orchestra.models.fake.re", "unknown model type 'orchestra.models.fake.re'"),  # a module, not a class
    ("collections.OrderedDict", "models[0]: 'collections.OrderedDict' is not a model (collections.OrderedDict "
                                "does not derive from BaseModel)"),
])
def test_what_is_not_a_model_class_is_one_config_error(spec: object, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        MODELS.resolve(spec, "models[0]")
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_module_whose_own_import_fails_is_named_with_what_is_missing(modules: Path) -> None:
    (modules / "regtest_needs.py").write_text("import regtest_not_installed_dependency\n\n\nclass Model:\n    pass\n")
    (modules / "regtest_needs_name.py").write_text("from os import no_such_name_xyz\n\n\nclass Model:\n    pass\n")
    with pytest.raises(ConfigError) as err:
        MODELS.resolve("regtest_needs.Model", "models[0]")
    assert str(err.value) == ("models[0]: model type 'regtest_needs.Model' cannot be imported: "
                              "No module named 'regtest_not_installed_dependency'")
    with pytest.raises(ConfigError, match="cannot import name 'no_such_name_xyz' from 'os'"):
        MODELS.resolve("regtest_needs_name.Model", "models[0]")


def test_a_name_is_registered_once() -> None:
    reg = Registry("widget", {"A": "collections.OrderedDict"})
    assert reg.resolve("A", "w") is OrderedDict and reg.names() == ["A"]
    with pytest.raises(KeyError, match="widget 'A' is already registered as collections.OrderedDict"):
        reg.register("A", "collections.Counter")


def run_users_model(tmp_path: Path, module: str, source: str, cls: str) -> tuple[Path, Any]:
    """Run the CLI on a config whose model is ``<module>.<cls>`` from the user's own module
    (``source``, importable from ``tmp_path``), over two rows; the config path and the result."""
    (tmp_path / f"{module}.py").write_text(source)
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "What is 1 + 1?", "a": "2"}\n{"q": "What is 2 + 5?", "a": "7"}\n')
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
models = [dict(type='{module}.{cls}', abbr='m')]
datasets = [dict(type='JsonlDataset', abbr='d', path={str(data)!r}, reader_cfg=dict(input_columns=['q'],
                 output_column='a'), infer_cfg=dict(prompt_template='{{q}}'), eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return cfg, subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True,
                               timeout=120, env=env)


def test_the_cli_says_in_one_line_which_dependency_of_a_users_model_is_missing(tmp_path: Path) -> None:
    cfg, res = run_users_model(tmp_path, "regtest_user_model", "import regtest_missing_dependency\n"
                               "from orchestra.models.fake import DeterministicModel\n\n\n"
                               "class Model(DeterministicModel):\n    pass\n", "Model")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        f"orchestra: error: {cfg}: models[0]: model type 'regtest_user_model.Model' cannot be imported: "
        "No module named 'regtest_missing_dependency'"], res.stderr
    assert not (tmp_path / "out").exists()


def test_a_class_defined_inside_a_function_is_refused_in_one_line() -> None:
    class Local(DeterministicModel):
        pass

    with pytest.raises(ConfigError) as err:
        MODELS.resolve(Local, "models[0]")
    assert str(err.value) == f"models[0]: model type '{dotted_name(Local)}' {NOT_BY_NAME}"
    assert dotted_name(Local).endswith(".test_a_class_defined_inside_a_function_is_refused_in_one_line.<locals>.Local")


SCRIPT = """
import orchestra
from orchestra.models.fake import DeterministicModel


class MyModel(DeterministicModel):
    '''A user's model, defined in the script that runs orchestra.'''


cfg = {{"models": [{{"type": MyModel, "abbr": "mine"}}],
        "datasets": [{{"type": "JsonlDataset", "abbr": "d", "path": {data!r},
                      "reader_cfg": {{"input_columns": ["q"], "output_column": "a"}},
                      "infer_cfg": {{"prompt_template": "{{q}}"}}, "eval_cfg": {{"evaluator": "numeric_match"}}}}]}}
try:
    orchestra.run(cfg, work_dir={out!r}, quiet=True)
except orchestra.errors.ConfigError as exc:
    print(exc)
"""


def test_a_class_of_the_script_being_run_is_refused_before_any_task_runs(tmp_path: Path) -> None:
    """Task processes have a ``__main__`` of their own: such a class used to fail every task with
    'unknown model type' after the plan was made and the run folder written."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "What is 1 + 1?", "a": "2"}\n')
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(data=str(data), out=str(tmp_path / "out")))
    res = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines() == [
        f"<config dict>: models[0]: model type '__main__.MyModel' {NOT_BY_NAME}"], res.stdout + res.stderr
    assert not (tmp_path / "out").exists()


def test_a_nested_class_of_a_users_module_runs_in_the_task_processes(tmp_path: Path) -> None:
    """A dotted path whose last two parts are classes: the task process imports the module and
    walks to the class (it used to look for a module ``regtest_nested.Outer`` and find none)."""
    _, res = run_users_model(tmp_path, "regtest_nested", "from orchestra.models.fake import DeterministicModel\n\n\n"
                             "class Outer:\n    class Inner(DeterministicModel):\n        pass\n", "Outer.Inner")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "d        numeric_match  1.0000" in res.stdout, res.stdout


def test_a_class_given_itself_must_derive_from_its_kinds_base_as_one_given_by_name() -> None:
    """A config built in Python (``orchestra.api``) hands the class itself, not its name: it is
    checked against the kind's base class all the same (the config check then relies on it)."""
    from orchestra.registry import RUNNERS
    from orchestra.runners.local import LocalRunner

    assert RUNNERS.resolve(LocalRunner, "infer.runner") is LocalRunner
    with pytest.raises(ConfigError, match=r"infer.runner: 'collections.OrderedDict' is not a runner "
                                          r"\(collections.OrderedDict does not derive from BaseRunner\)"):
        RUNNERS.resolve(OrderedDict, "infer.runner")
