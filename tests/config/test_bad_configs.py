"""Every bad config in ``tests/bad_configs`` ends the real CLI with exit 2 and one clear line.

The CLI runs as a process of its own from the repository root, as a user would start it (forked
from a server that has imported its third-party modules once: ``tests/cli_fork.py``).
The subprocesses are started all at once from a module fixture (they are independent), and
each case then checks its own result.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.cli_fork import ForkedCLI

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "bad_configs"
GOOD = "configs/eval_demo.py"

# bad config -> (fragment the error must contain, what it must name besides the fragment).
# ``None`` as the name means "the config file itself".
EXPECTED: dict[str, tuple[str, str | None]] = {
    "syntax_error.py": ("syntax error", None),
    "unknown_top_level_key.py": ("unknown top-level key 'max_num_worker'", None),
    "misspelt_list_key.py": ("unknown top-level key 'work_dirs'", None),
    "model_unknown_key.py": ("unknown key 'max_out_length' for DeterministicModel; valid keys:", "models[0]"),
    "model_unknown_class.py": ("unknown model type 'NoSuchModel'; valid: AnthropicAPI, DeterministicModel",
                               "models[0]"),
    "model_bool_for_int.py": ("expected int, got True", "models[0].batch_size"),
    "run_cfg_unknown_key.py": ("unknown key 'num_gpu'; valid keys: num_gpus, num_procs", "models[0].run_cfg"),
    "dataset_unknown_class.py": ("unknown dataset type 'ParquetDatasetX'; valid:", "datasets[0]"),
    "dataset_missing_file.py": ("does not exist", "no_such_file.jsonl"),
    "bad_jsonl_row.py": ("not valid JSON", "broken.jsonl:2"),
    "negative_max_num_workers.py": ("max_num_workers must be an integer >= 1, got -1", "infer.runner"),
    "negative_retry.py": ("retry must be an integer >= 0, got -1", "eval.runner"),
    "wrong_type_max_num_workers.py": ("expected int | None, got str 'two'", "infer.runner.max_num_workers"),
    "missing_models.py": ("missing required key 'models'", None),
    "empty_datasets.py": ("datasets must be a non-empty list", None),
    "dataset_missing_abbr.py": ("missing required key 'abbr'", "datasets[0]"),
    "duplicate_model_abbr.py": ("'m' is also used by models[0]", "models[1].abbr"),
    "unknown_inferencer_type.py": ("'generate' is not valid; valid: gen, loglik, chat", "inferencer.type"),
    "unknown_inferencer_key.py": ("unknown key 'max_new_tokens' for gen; valid keys:", "infer_cfg.inferencer"),
    "loglik_without_choices.py": ("loglik needs choices_column", "datasets[0].infer_cfg.inferencer"),
    "unknown_evaluator.py": ("unknown evaluator type 'bleu_score_x'; valid: accuracy", "eval_cfg.evaluator"),
    "prompt_unknown_field.py": ("uses unknown field {nope}; input_columns are: question", "prompt_template"),
    "reader_column_missing.py": ("column 'prompt' not in", "datasets[0]"),
    "reader_cfg_unknown_key.py": ("unknown key 'input_column'; valid keys: input_columns", "datasets[0].reader_cfg"),
    "infer_cfg_unknown_key.py": ("unknown key 'prompt_templates'; valid keys:", "datasets[0].infer_cfg"),
    "test_range_garbage.py": ("test_range='garbage' is not valid", "reader_cfg"),
    "size_partitioner_zero.py": ("max_task_size must be > 0, got 0", "infer.partitioner"),
    "partitioner_size_nan.yaml": ("expected a finite number, got nan", "infer.partitioner.max_task_size"),
    "partitioner_coef_nan.yaml": ("expected a finite number, got nan", "infer.partitioner.gen_task_coef"),
    "evaluator_unknown_key.py": ("unknown key 'ignore_case' for AccuracyEvaluator; it takes no keys",
                                 "datasets[0].eval_cfg.evaluator"),
    "not_a_mapping.yaml": ("a config is a mapping of keys (models, datasets, infer, eval, work_dir, ...), got a list",
                           None),
    "partitioner_unknown_key.py": ("unknown key 'max_task_sise' for SizePartitioner", "infer.partitioner"),
    "dataset_coef_unknown_abbr.py": ("no dataset has abbr 'tinny'; datasets: tiny", "dataset_coef"),
    "naive_n_zero.py": ("n must be an integer >= 1, got 0", "eval.partitioner"),
    "unknown_stage_key.py": ("unknown key 'runners'; valid keys: partitioner, runner", "infer"),
    "stage_not_dict.py": ("expected a dict with partitioner, runner", "infer"),
    "runner_unknown_type.py": ("unknown runner type 'KubernetesRunner'; valid: DLCRunner, LocalRunner", "infer.runner"),
    "template_without_task_cmd.py": ("must contain {task_cmd}", "infer.runner.template"),
    "template_unknown_field.py": ("unknown field {numa_node}; valid:", "infer.runner.template"),
    "infer_task_on_eval.py": ("InferTask runs the infer stage, not eval", "eval.runner.task"),
    "secret_in_config.py": ("secrets do not belong in a config", "models[0].api_key"),
    # before: accepted, and saved in the run's config.py and every task spec (the key names did not
    # end in a config-key secret word)
    "secret_in_server_env.py": ("looks like a secret given in clear", "models[0].server.env.AWS_SECRET_ACCESS_KEY"),
    "secret_in_ray_env_vars.py": ("looks like a secret given in clear",
                                  "infer.runner.runtime_env.env_vars.AWS_SECRET_ACCESS_KEY"),
    "secret_in_base_url.py": ("a URL with a key in its query;", "models[0].base_url"),  # accepted before
    "raises_at_import.py": ("ZeroDivisionError: division by zero", "raises_at_import.py:10"),
    "bad_key.yaml": ("unknown key 'batch_sise' for DeterministicModel", "models[0]"),
    "not_a_config.txt": ("unsupported config type '.txt'", None),
    "mixed_base_styles.py": ("inheritance chain must match", None),
    "model_type_is_a_dataset.py": ("is not a model (orchestra.datasets.files.JsonlDataset", "models[0]"),
}
# work_dir is only checked when -w does not replace it.
NO_WORK_DIR_FLAG = {"work_dir_not_string.py": ("work_dir must be a path string, got 42", None)}
# These also run without --dry-run (the real path that would write a run folder).
ALSO_FOR_REAL = ["unknown_top_level_key.py", "negative_max_num_workers.py", "prompt_unknown_field.py",
                 "secret_in_config.py", "secret_in_server_env.py", "size_partitioner_zero.py", "bad_key.yaml",
                 "evaluator_unknown_key.py"]


class Result(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def run_cli(cli: ForkedCLI, args: list[str], env: dict[str, str]) -> Result:
    """``run.py ARGS`` to its end (forked: ``tests/cli_fork.py``)."""
    proc = cli.run([sys.executable, "run.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def rel(name: str) -> str:
    return os.path.relpath(BAD / name, REPO)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("cache")
    return {**os.environ, "ORCHESTRA_CACHE_DIR": str(cache)}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def results(env: dict[str, str], work: Path, cli: ForkedCLI) -> dict[tuple[str, ...], Result]:
    """Every CLI invocation of this module, run concurrently once."""
    jobs: list[tuple[str, ...]] = []
    for name in EXPECTED:
        jobs.append((rel(name), "--dry-run", "-w", str(work / "dry")))
    for name in NO_WORK_DIR_FLAG:
        jobs.append((rel(name), "--dry-run"))
    for name in ALSO_FOR_REAL:
        jobs.append((rel(name), "-w", str(work / "real")))
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 2) * 2)) as pool:
        done = pool.map(lambda a: run_cli(cli, list(a), env), jobs)
        return dict(zip(jobs, done))


def assert_one_line_error(res: Result, fragment: str, names: str) -> None:
    assert res.rc == 2, f"exit {res.rc}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{res.stderr}"
    assert lines[0].startswith("orchestra: error: ")
    assert fragment in lines[0], lines[0]
    assert names in lines[0], f"{names!r} not named in: {lines[0]}"
    assert res.stdout == ""


def test_every_bad_config_is_paired() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.suffix in (".py", ".yaml", ".txt")}
    assert on_disk == set(EXPECTED) | set(NO_WORK_DIR_FLAG)
    assert len(on_disk) >= 18


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_config_dry_run(name: str, results: dict[tuple[str, ...], Result], work: Path) -> None:
    fragment, names = EXPECTED[name]
    res = results[(rel(name), "--dry-run", "-w", str(work / "dry"))]
    assert_one_line_error(res, fragment, names or rel(name))
    if names is not None and not names.endswith(".jsonl") and ".jsonl:" not in names:
        assert rel(name) in res.stderr  # the config file is named as well as the key


@pytest.mark.parametrize("name", sorted(NO_WORK_DIR_FLAG))
def test_bad_config_without_work_dir_flag(name: str, results: dict[tuple[str, ...], Result]) -> None:
    fragment, _ = NO_WORK_DIR_FLAG[name]
    assert_one_line_error(results[(rel(name), "--dry-run")], fragment, rel(name))


@pytest.mark.parametrize("name", ALSO_FOR_REAL)
def test_bad_config_real_run_writes_nothing(name: str, results: dict[tuple[str, ...], Result], work: Path) -> None:
    fragment, names = EXPECTED[name]
    assert_one_line_error(results[(rel(name), "-w", str(work / "real"))], fragment, names or rel(name))
    assert not (work / "real").exists() or not any((work / "real").iterdir())


def test_debug_shows_traceback(env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    """--debug keeps the traceback of a user error (for whoever has to chase it)."""
    res = run_cli(cli, [rel("negative_max_num_workers.py"), "--dry-run", "--debug", "-w", str(tmp_path)], env)
    assert res.rc != 0
    assert "Traceback (most recent call last)" in res.stderr
    assert "ConfigError" in res.stderr
    assert "max_num_workers must be an integer >= 1, got -1" in res.stderr


def test_cfg_options_negative_workers_on_good_config(env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    args = [GOOD, "--dry-run", "-w", str(tmp_path), "--cfg-options", "infer.runner.max_num_workers=-3"]
    assert_one_line_error(run_cli(cli, args, env), "max_num_workers must be an integer >= 1, got -3", "infer.runner")


def test_good_config_dry_run_passes(env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    """The control: the same invocation on the good config succeeds and writes nothing."""
    res = run_cli(cli, [GOOD, "--dry-run", "-w", str(tmp_path)], env)
    assert res.rc == 0, res.stderr
    assert "[infer]" in res.stdout and "[eval]" in res.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--mode", "bogus"], "invalid choice: 'bogus'"),
        (["--max-num-workers", "0"], "--max-num-workers 0: must be >= 1"),
        (["--retry", "-1"], "--retry -1: must be >= 0"),
        (["--slurm"], "--slurm needs -p/--partition"),
        (["--cfg-options", "infer.runner.max_num_workers"], "expected KEY=VALUE"),
    ],
)
def test_usage_errors(args: list[str], fragment: str, env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    res = run_cli(cli, [GOOD, "--dry-run", "-w", str(tmp_path), *args], env)
    assert_one_line_error_usage(res, fragment)


def assert_one_line_error_usage(res: Result, fragment: str) -> None:
    assert res.rc == 2, f"exit {res.rc}\nstderr: {res.stderr}"
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert fragment in lines[0], lines[0]


def test_missing_config_path(env: dict[str, str], cli: ForkedCLI) -> None:
    res = run_cli(cli, [], env)
    assert_one_line_error_usage(res, "the following arguments are required: config")


def test_config_file_not_found(env: dict[str, str], cli: ForkedCLI) -> None:
    res = run_cli(cli, ["configs/no_such_config.py", "--dry-run"], env)
    assert_one_line_error_usage(res, "configs/no_such_config.py: config file not found")


def test_reuse_unknown_run_on_empty_work_dir(env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    res = run_cli(cli, [GOOD, "-w", str(tmp_path), "-r", "NOPE"], env)
    assert_one_line_error_usage(res, f"-r NOPE: no run folder {tmp_path / 'NOPE'}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "fragment"), [
    (["-p", "debug"], "-p/--partition and -q/--qos need --slurm"),
    (["-q", "high"], "-p/--partition and -q/--qos need --slurm"),
    (["--slurm", "-q", "high"], "--slurm needs -p/--partition"),
    (["--cfg-options", "1x=2"], "'1x' is not a dotted key such as infer.runner.retry"),
    (["--cfg-options", "models.0.batch_size=[1,"], "the value is not a valid Python literal"),
])
def test_more_usage_errors(args: list[str], fragment: str, env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    """Flags that only make sense together, and overrides that are not KEY=VALUE: one line, exit 2."""
    res = run_cli(cli, [GOOD, "--dry-run", "-w", str(tmp_path), *args], env)
    assert_one_line_error_usage(res, fragment)
    assert list(tmp_path.iterdir()) == []


def test_a_work_dir_that_cannot_be_a_folder_is_one_line(env: dict[str, str], tmp_path: Path, cli: ForkedCLI) -> None:
    """-w naming a file is a usage error (exit 2); -w under a file cannot be made, an OSError the
    CLI prints as one line naming the path (exit 1), never a traceback."""
    afile = tmp_path / "notes.txt"
    afile.write_text("not a folder")
    res = run_cli(cli, [GOOD, "-w", str(afile)], env)
    assert_one_line_error_usage(res, f"work dir {afile} is a file, not a folder; give -w a folder")
    res = run_cli(cli, [GOOD, "-w", str(afile / "runs")], env)
    assert res.rc == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr == (f"orchestra: error: {afile / 'runs'}: Not a directory (check that the folder exists, is "
                          "writable and its disk has room; --debug shows the traceback)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("name", ["secret_in_config.py", "secret_in_server_env.py", "secret_in_ray_env_vars.py",
                                  "secret_in_base_url.py"])
def test_a_refused_secret_is_never_repeated(name: str, results: dict[tuple[str, ...], Result], work: Path) -> None:
    res = results[(rel(name), "--dry-run", "-w", str(work / "dry"))]
    assert res.rc == 2 and "not-real" not in res.stdout + res.stderr and "not-a-real" not in res.stderr


def test_dumped_env_dicts_redact_secret_looking_variables() -> None:
    """Defence in depth behind the check: the dump redacts what the check refuses."""
    from orchestra.config.dump import redact

    cfg = {"server": {"env": {"AWS_SECRET_ACCESS_KEY": "v1", "HF_HOME": "/h", "AWS_SESSION_KEY": "$OTHER"}},
           "runtime_env": {"env_vars": {"ANTHROPIC_KEY": "v2"}}, "sort_key": "kept"}
    assert redact(cfg) == {"server": {"env": {"AWS_SECRET_ACCESS_KEY": "<redacted>", "HF_HOME": "/h",
                                              "AWS_SESSION_KEY": "$OTHER"}},
                           "runtime_env": {"env_vars": {"ANTHROPIC_KEY": "<redacted>"}}, "sort_key": "kept"}
