"""Loading configs: read_base(), ``_base_`` inheritance, YAML, ``--cfg-options`` precedence,
and the resolved copy saved in the run folder (which never holds a secret)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestra.config import dump_config, load_config, validate
from orchestra.errors import ConfigError
from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "eval_demo.py"


@pytest.fixture(autouse=True)
def _cache_and_cwd(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Dataset paths in the demo are relative to the repository root, as for a user running there.
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ORCHESTRA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", *args], timeout=120, env={**os.environ, **(env or {})})


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def child_of_demo(tmp_path: Path, body: str) -> Path:
    """A config in ``tmp_path`` that inherits configs/eval_demo.py through read_base()."""
    (tmp_path / "repo_configs").symlink_to(REPO / "configs")
    return write(tmp_path / "child.py", "from mmengine.config import read_base\n\nwith read_base():\n"
                 "    from .repo_configs.eval_demo import *\n" + textwrap.dedent(body))


# --------------------------------------------------------------------------------------
# formats and inheritance


def test_py_config_with_read_base() -> None:
    raw = load_config(str(DEMO))
    assert [m["abbr"] for m in raw["models"]] == ["deterministic"]  # from models/deterministic.py
    assert [d["abbr"] for d in raw["datasets"]] == ["arith", "capitals"]  # from datasets/demo.py
    cfg = validate(raw, str(DEMO))
    assert cfg.models[0]["type"] == "orchestra.models.fake.DeterministicModel"
    assert type(cfg.stages["infer"].partitioner).__name__ == "SizePartitioner"
    assert cfg.stages["infer"].partitioner.max_task_size == 800
    assert cfg.stages["infer"].runner_kwargs == {"max_num_workers": 2, "retry": 1}
    # relative data paths are made absolute: tasks must not depend on the cwd
    assert all(os.path.isabs(d["path"]) for d in cfg.datasets)


def test_read_base_child_overrides_parent(tmp_path: Path) -> None:
    path = child_of_demo(tmp_path, """
        from orchestra.partitioners import NumWorkerPartitioner

        datasets = [demo_datasets[0]]
        infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=3))
        work_dir = 'outputs/child'
        """)
    cfg = validate(load_config(str(path)), str(path))
    assert [d["abbr"] for d in cfg.datasets] == ["arith"]
    assert type(cfg.stages["infer"].partitioner).__name__ == "NumWorkerPartitioner"
    assert cfg.stages["infer"].partitioner.num_worker == 3
    # A whole-value assignment replaces the parent's infer; the default runner is used.
    assert cfg.stages["infer"].runner_cls.__name__ == "LocalRunner"
    assert cfg.stages["infer"].runner_kwargs == {}
    assert cfg.work_dir == "outputs/child"
    assert cfg.models[0]["abbr"] == "deterministic"  # inherited untouched


def test_base_inheritance_merges_dicts(tmp_path: Path) -> None:
    data = REPO / "configs" / "data" / "arith.jsonl"
    write(tmp_path / "base.py", f"""
        models = [dict(type='DeterministicModel', abbr='m', batch_size=8)]
        datasets = [dict(type='JsonlDataset', abbr='arith', path={str(data)!r},
                         reader_cfg=dict(input_columns=['question'], output_column='answer'),
                         infer_cfg=dict(prompt_template='{{question}}'),
                         eval_cfg=dict(evaluator='numeric_match'))]
        infer = dict(partitioner=dict(type='SizePartitioner', max_task_size=100),
                     runner=dict(type='LocalRunner', max_num_workers=2, retry=1,
                                 task=dict(type='InferTask')))
        work_dir = 'outputs/base'
        """)
    child = write(tmp_path / "child.py", """
        _base_ = ['./base.py']
        infer = dict(runner=dict(max_num_workers=3))
        work_dir = 'outputs/child'
        """)
    raw = load_config(str(child))
    cfg = validate(raw, str(child))
    infer = cfg.stages["infer"]
    assert infer.runner_kwargs == {"max_num_workers": 3, "retry": 1}  # merged, not replaced
    assert infer.partitioner.max_task_size == 100  # kept from the base
    assert cfg.work_dir == "outputs/child"
    assert cfg.models[0]["batch_size"] == 8


def test_yaml_config(tmp_path: Path) -> None:
    path = write(tmp_path / "demo.yaml", f"""
        models:
          - {{type: DeterministicModel, abbr: m}}
        datasets:
          - type: JsonlDataset
            abbr: arith
            path: {REPO / 'configs' / 'data' / 'arith.jsonl'}
            reader_cfg: {{input_columns: [question], output_column: answer}}
            infer_cfg:
              prompt_template: "Q: {{question}}"
              inferencer: {{type: gen, max_out_len: 8}}
            eval_cfg: {{evaluator: numeric_match}}
        infer:
          partitioner: {{type: SizePartitioner, max_task_size: 500, gen_task_coef: 10}}
          runner: {{type: LocalRunner, max_num_workers: 3, task: {{type: InferTask}}}}
        work_dir: outputs/yaml
        """)
    cfg = validate(load_config(str(path)), str(path))
    assert cfg.stages["infer"].partitioner.max_task_size == 500
    assert cfg.stages["infer"].runner_kwargs == {"max_num_workers": 3}
    # and the CLI plans it: 120 rows x 10 / 500 -> 3 shards
    res = cli([str(path), "--dry-run", "-w", str(tmp_path / "w"), "--cfg-options", "infer.runner.retry=2"])
    assert res.returncode == 0, res.stderr
    assert len(re.findall(r"^  infer_m_arith_\d", res.stdout, re.M)) == 3


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "none.py"))
    (tmp_path / "cfg.toml").write_text("")
    with pytest.raises(ConfigError, match=r"unsupported config type '\.toml'"):
        load_config(str(tmp_path / "cfg.toml"))


def test_calling_an_import_in_a_py_config_is_explained(tmp_path: Path) -> None:
    path = write(tmp_path / "calls.py", """
        import os
        models = [dict(type='DeterministicModel', abbr=os.path.basename('m'))]
        """)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    msg = str(info.value)
    assert "calls.py:3" in msg and "lazy import" in msg and "\n" not in msg


# --------------------------------------------------------------------------------------
# --cfg-options and precedence: config file < --cfg-options < explicit CLI flags


def test_cfg_options_override_nested_and_list_items() -> None:
    raw = load_config(str(DEMO), ["infer.runner.max_num_workers=7", "models.0.batch_size=3",
                                  "infer.partitioner.gen_task_coef=2.5", "work_dir=outputs/x"])
    assert raw["infer"]["runner"]["max_num_workers"] == 7
    assert raw["infer"]["runner"]["retry"] == 1  # siblings untouched
    assert raw["models"][0]["batch_size"] == 3
    assert raw["infer"]["partitioner"]["gen_task_coef"] == 2.5
    assert raw["work_dir"] == "outputs/x"
    cfg = validate(raw, str(DEMO))
    assert cfg.stages["infer"].partitioner.gen_task_coef == 2.5


def test_cfg_options_bad_item() -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(str(DEMO), ["infer.runner.max_num_workers"])


def _num_workers_in_plan(stdout: str) -> set[str]:
    return set(re.findall(r"max_num_workers=(\d+)", stdout))


@pytest.mark.parametrize(
    ("flags", "infer_workers", "eval_workers"),
    [
        ([], "2", "2"),  # the config file
        (["--cfg-options", "infer.runner.max_num_workers=3"], "3", "2"),  # beats the file
        (["--cfg-options", "infer.runner.max_num_workers=3", "--max-num-workers", "5"], "5", "5"),  # flag wins
    ],
)
def test_precedence(flags: list[str], infer_workers: str, eval_workers: str, tmp_path: Path) -> None:
    res = cli([str(DEMO.relative_to(REPO)), "--dry-run", "-w", str(tmp_path), *flags])
    assert res.returncode == 0, res.stderr
    infer, eval_ = res.stdout.split("[eval]")
    assert _num_workers_in_plan(infer) == {infer_workers}
    assert _num_workers_in_plan(eval_) == {eval_workers}


def test_cfg_options_change_the_plan(tmp_path: Path) -> None:
    base = cli(["configs/eval_demo.py", "--dry-run", "-w", str(tmp_path)])
    small = cli(["configs/eval_demo.py", "--dry-run", "-w", str(tmp_path),
                 "--cfg-options", "infer.partitioner.max_task_size=100"])
    assert base.returncode == small.returncode == 0, small.stderr
    count = lambda out: len(re.findall(r"^  infer_", out, re.M))  # noqa: E731
    assert count(small.stdout) > count(base.stdout)


def test_secret_through_cfg_options_is_refused_and_not_echoed(tmp_path: Path) -> None:
    sentinel = "sk-SENTINEL-cfg-options-0042"
    res = cli(["configs/eval_demo.py", "--dry-run", "-w", str(tmp_path),
               "--cfg-options", f"models.0.api_key={sentinel}"])
    assert res.returncode == 2
    assert "models[0].api_key: secrets do not belong in a config" in res.stderr
    assert sentinel not in res.stderr + res.stdout


def test_cfg_options_set_the_default_runner_of_a_config_that_names_none(tmp_path: Path) -> None:
    """The CLI's own example, ``--cfg-options infer.runner.max_num_workers=4``, on a config that
    relies on the default runner made a runner dict without a type: 'infer.runner: missing
    required key 'type''.  A runner (or partitioner) without a type is now the stage's default."""
    cfg = write(tmp_path / "cfg.yaml", f"""
        models:
          - {{type: DeterministicModel, abbr: m}}
        datasets:
          - type: JsonlDataset
            abbr: arith
            path: {REPO / 'configs' / 'data' / 'arith.jsonl'}
            reader_cfg: {{input_columns: [question], output_column: answer}}
            infer_cfg: {{prompt_template: "Q: {{question}}"}}
        """)
    res = cli([str(cfg), "--dry-run", "-w", str(tmp_path / "w"), "--cfg-options", "infer.runner.max_num_workers=4",
               "eval.runner.retry=2", "infer.partitioner.gen_task_coef=3"])
    assert res.returncode == 0, res.stderr
    assert "[infer] 1 task(s) to run, 0 output(s) reused, runner LocalRunner (max_num_workers=4, retry=0)" \
        in res.stdout, res.stdout
    assert "runner LocalRunner (max_num_workers=4, retry=2)" in res.stdout, res.stdout
    assert "cost=360" in res.stdout, res.stdout  # 120 rows x gen_task_coef 3, NaivePartitioner's


@pytest.mark.parametrize(("item", "said"), [
    ("models.5.batch_size=2", "models has 1 item(s); '5' is not one of its indices"),
    ("models.0=abc", "models.0 holds a dict; set a key inside it (e.g. models.0.abbr=...) or give a dict"),
    ("models.0.abbr.x=1", "TypeError: abbr={'x': 1} in child config cannot inherit from base"),
])
def test_cfg_options_that_cannot_be_set_name_the_item_and_never_quote_the_config(
        item: str, said: str, tmp_path: Path) -> None:
    """An override mmengine cannot merge used to be ``--cfg-options: <mmengine's words>``: no item
    named (``'str' object has no attribute 'items'``), or the whole list quoted (``Index 5 exceeds
    the length of list [...]``), a secret of the config included, before the secret check ran."""
    sentinel = "sk-SENTINEL-in-the-file-0043"
    cfg = write(tmp_path / "cfg.yaml", f"""
        models:
          - {{type: DeterministicModel, abbr: m, api_key: {sentinel}}}
        datasets: []
        """)
    res = cli([str(cfg), "--dry-run", "-w", str(tmp_path / "w"), "--cfg-options", "models.0.batch_size=4", item])
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"orchestra: error: --cfg-options {item!r}: {said}"), lines[0]
    assert sentinel not in res.stderr + res.stdout


@pytest.mark.parametrize(("name", "text", "said"), [
    ("syntax.yaml", "models: [\n  - a: b\n", "syntax.yaml:2: YAML syntax error: expected the node content"),
    ("syntax.json", '{"models": [1,]}', "syntax.json:1: JSON syntax error: Expecting value"),
    ("latin1.yaml", "models: caf\xe9\n", "latin1.yaml: cannot read config: 'utf-8' codec can't decode byte 0xe9"),
    ("tag.yaml", "models: !!python/object/apply:os.system ['touch {ran}']\n",
     "tag.yaml:1: YAML tag not allowed (could not determine a constructor"),
    ("child.yaml", "_base_: [tag.yaml]\nwork_dir: out\n", "tag.yaml:1: YAML tag not allowed"),
    # before: 'cannot load config: RecursionError: maximum recursion depth exceeded'
    ("loop.yaml", "_base_: loop.yaml\n", "loop.yaml: _base_ 'loop.yaml' inherits from itself (loop.yaml -> loop.yaml)"),
    # before: 'cannot load config: TypeError: argument of type 'int' is not iterable'
    ("bases.yaml", "_base_: [1, 2]\n", "bases.yaml: _base_: expected a file name or a list of file names, got [1, 2]"),
])
def test_a_yaml_or_json_config_is_parsed_safely_first(name: str, text: str, said: str, tmp_path: Path) -> None:
    """A data config (and each of its ``_base_`` files) is read with a safe parser before mmengine
    loads it: a syntax error names the file and line, bytes that are not UTF-8 are one line, and a
    ``!!python`` tag, which mmengine's loader would run, is refused (the command never runs)."""
    ran = tmp_path / "code-ran"
    (tmp_path / "tag.yaml").write_text(f"models: !!python/object/apply:os.system ['touch {ran}']\n")
    path = tmp_path / name
    path.write_bytes(text.replace("{ran}", str(ran)).encode("latin-1"))
    res = cli([str(path), "--dry-run", "-w", str(tmp_path / "w")])
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("orchestra: error: ") and said in lines[0], lines[0]
    assert not ran.exists()


# --------------------------------------------------------------------------------------
# the resolved config in the run folder

KEY_MODEL = '''
import os

from orchestra.models.fake import DeterministicModel


class KeyModel(DeterministicModel):
    """The deterministic model, but it needs an API key from the environment variable ``key_env``."""

    validate_by_construction = False  # reads the key when built: only inside the task

    def __init__(self, abbr, key_env="OPENAI_API_KEY", **kwargs):
        super().__init__(abbr, **kwargs)
        if not os.environ.get(key_env):
            raise RuntimeError(f"environment variable {key_env} is not set")
'''


def test_run_folder_never_holds_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = "SENTINEL-secret-value-5f3a9c"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "keymodel.py").write_text(KEY_MODEL)
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    path = child_of_demo(cfg_dir, """
        models = [dict(type='keymodel.KeyModel', abbr='keyed', key_env='X_ORCHESTRA_TEST_KEY', batch_size=4)]
        """)
    work = tmp_path / "work"
    env = {"X_ORCHESTRA_TEST_KEY": sentinel,
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), os.environ.get("PYTHONPATH", "")])}
    res = cli([str(path), "-w", str(work), "--max-num-workers", "5"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sentinel not in res.stdout + res.stderr
    (run,) = list(work.iterdir())
    saved = (run / "config.py").read_text()
    assert "X_ORCHESTRA_TEST_KEY" in saved  # the name of the variable is kept...
    assert "'max_num_workers': 5" in saved  # ...and CLI flags are part of the resolved config
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) > 5  # predictions, results, logs, events, summary
    for p in files:
        assert sentinel.encode() not in p.read_bytes(), f"secret written to {p}"
    # the task really got the key (KeyModel refuses to start without it): results exist
    assert list((run / "results").rglob("*.json"))
    # and the saved config loads and validates again
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    again = validate(load_config(str(run / "config.py")), str(run / "config.py"))
    assert again.models[0]["key_env"] == "X_ORCHESTRA_TEST_KEY"


def test_dump_config_redacts_secret_looking_keys(tmp_path: Path) -> None:
    out = tmp_path / "config.py"
    dump_config({"models": [{"abbr": "m", "api_key": "sk-1", "nested": {"auth_token": "tok-2"}}],
                 "work_dir": "w"}, str(out))
    text = out.read_text()
    assert "sk-1" not in text and "tok-2" not in text
    assert text.count("<redacted>") == 2
