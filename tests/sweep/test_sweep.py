"""Sweeps and the Python API (issue 14), with real task processes and the deterministic model."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import orchestra
from orchestra.errors import ConfigError, UserError

REPO = Path(__file__).resolve().parents[2]
EVALUATORS = {"num": "numeric_match", "exact": "exact_match", "acc": "accuracy"}


def write_data(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, offset in (("add", 0), ("add_big", 1000), ("add_neg", -50), ("words", None)):
        path = folder / f"{name}.jsonl"
        with open(path, "w") as f:
            for i in range(12):
                if offset is None:
                    row = {"question": f"say w{i}", "answer": f"W{i}" if i % 3 else "nope"}
                else:
                    row = {"question": f"What is {i + offset} + {i}?", "answer": str(2 * i + offset + (i % 4 == 0))}
                f.write(json.dumps(row) + "\n")
        files[name] = path
    return files


def config(tmp_path: Path, models: list[str], evaluator: str | None = None, sweep: str = "") -> Path:
    """A config over the four datasets; ``evaluator`` fixed, or swept through ``sweep``."""
    files = write_data(tmp_path / "data")
    datasets = ",\n".join(
        f"    dict(type=JsonlDataset, abbr={name!r}, path={str(path)!r}, "
        "reader_cfg=dict(input_columns=['question'], output_column='answer'), "
        "infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_out_len=8)), "
        f"eval_cfg=dict(evaluator={evaluator or 'numeric_match'!r}))"
        for name, path in files.items()
    )
    model_list = ", ".join(f"dict(type=DeterministicModel, abbr={m!r}, batch_size=4)" for m in models)
    cfg = tmp_path / f"cfg_{len(list(tmp_path.glob('cfg_*.py')))}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.runners import LocalRunner

models = [{model_list}]
datasets = [
{datasets}
]
infer = dict(runner=dict(type=LocalRunner, max_num_workers=2, reuse_workers=True))
# warm workers for the eval stage too: 36 + 3 x 12 eval tasks, each a new process otherwise (~2x the CPU)
eval = dict(runner=dict(type=LocalRunner, max_num_workers=2, reuse_workers=True))
work_dir = {str(tmp_path / 'out')!r}
{sweep}
""")
    return cfg


def cli(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


MODELS = ["m1", "m2", "m3"]
SWEEP = "sweep = dict(params={'datasets.eval_cfg.evaluator': " + repr(EVALUATORS) + "}, baseline={'evaluator': 'num'})"


def test_sweep_pivot_matches_hand_written_configs_and_shares_predictions(tmp_path: Path) -> None:
    cfg = config(tmp_path / "sweep", MODELS, sweep=SWEEP)
    dry = cli(cfg, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "sweep: 36 (model, dataset) pair(s) over evaluator" in dry.stdout and "add[exact]" in dry.stdout
    # 3 models x 4 datasets x 3 evaluators: the evaluator only changes scoring, so 2 of every 3
    # variants' predictions are shared, and only 12 prediction files are made.
    assert "24 prediction file(s) shared" in dry.stdout
    res = cli(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = [p for p in (tmp_path / "sweep" / "out").iterdir() if p.is_dir()]
    assert len(list((run / "predictions").rglob("*.jsonl"))) == 12
    started = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    infer_started = [e for e in started if e["event"] == "started" and e["stage"] == "infer"]
    assert len(infer_started) == 12  # one task per model and dataset, not per evaluator
    rows = json.loads((run / "summary/pivot.json").read_text())["rows"]
    pivot = {(r["model"], r["dataset"], r["metric"]): r for r in rows}

    checked = 0
    for label, evaluator in EVALUATORS.items():  # the same work as 3 hand-written configs, run one by one
        single = tmp_path / label
        res = cli(config(single, MODELS, evaluator=evaluator))
        assert res.returncode == 0, res.stderr
        (srun,) = [p for p in (single / "out").iterdir() if p.is_dir()]
        with open(srun / "summary/summary.csv") as f:
            for row in csv.DictReader(f):
                for model in MODELS:
                    got = pivot[(model, row["dataset"], row["metric"])]["values"][label]
                    assert got == pytest.approx(float(row[model])), (label, model, row)
                    checked += 1
    assert checked >= 36
    deltas = [r["deltas"] for r in pivot.values() if r["deltas"]]
    assert deltas and all(set(d) == {"exact", "acc"} for d in deltas)  # each against the baseline 'num'


def test_sweep_bad_input_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    cases = [
        ("sweep = dict(params={'models.no_such_key': [1, 2]})", "no_such_key"),
        ("sweep = dict(params={'models.batch_size': ['four']})", "batch_size"),
        ("sweep = dict(params={'models.batch_size': []})", "no values"),
        ("sweep = dict(params={'temperature': [0, 1]})", "must start with 'models.' or 'datasets.'"),
        ("sweep = dict(params={'datasets.eval_cfg.evaluator': {'a': 'accuracy'}}, baseline={'evaluator': 'b'})",
         "baseline.evaluator"),
        ("sweep = dict(params={'models.batch_size': [1, 2, 3]}, max_variants=2)", "--yes"),
    ]
    for i, (sweep, expected) in enumerate(cases):
        res = cli(config(tmp_path / str(i), ["m1"], sweep=sweep))
        assert res.returncode == 2, (sweep, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (sweep, res.stderr)
        assert not (tmp_path / str(i) / "out").exists()
    dup = config(tmp_path / "dup", ["m1", "m1"], sweep="sweep = dict(params={'models.batch_size': [1]})")
    res = cli(dup)
    assert res.returncode == 2 and "also used by" in res.stderr
    big = config(tmp_path / "big", ["m1"],
                 sweep="sweep = dict(params={'models.batch_size': [1, 2, 3]}, max_variants=2)")
    assert cli(big, "--yes").returncode == 0


def test_sweep_too_large_is_refused_before_any_variant_is_built(tmp_path: Path) -> None:
    """The pair count is a product of list lengths: a sweep over max_variants is refused from that
    product, before expansion. This one could not even be expanded ('batch_size' holds 4, not a
    dict), so a refusal naming the count and --yes proves nothing was built first."""
    sweep = ("sweep = dict(params={'models.batch_size.x': list(range(300)), "
             "'datasets.infer_cfg.foo': list(range(300)), 'datasets.eval_cfg.bar': [1, 2, 3]}, max_variants=50)")
    cfg = config(tmp_path, ["m1"], sweep=sweep)
    res = cli(cfg)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    # 1 model x 300 values, 4 datasets x 300 x 3 values
    assert "expands to 1080000 (model, dataset) pairs" in lines[0] and "max_variants=50" in lines[0], lines[0]
    assert "--yes" in lines[0] and not (tmp_path / "out").exists()
    # with --yes it is expanded, and the axis that cannot be set is named
    res = cli(cfg, "--yes")
    assert res.returncode == 2 and "cannot set batch_size.x" in res.stderr, res.stderr


def test_dry_run_of_a_sweep_too_large_is_refused_at_once_and_yes_plans_it(tmp_path: Path) -> None:
    """``--dry-run`` used to expand and plan a sweep of any size (a valid 3000 x 3000 sweep: killed
    at 60 s holding 2 GB; this one, which cannot be expanded, failed on its first variant instead
    of naming its size).  Now it is refused from the product as a run is, and ``--dry-run --yes``
    plans a sweep over ``max_variants``."""
    sweep = ("sweep = dict(params={'models.batch_size.x': list(range(300)), "
             "'datasets.infer_cfg.foo': list(range(300)), 'datasets.eval_cfg.bar': [1, 2, 3]}, max_variants=50)")
    started = time.monotonic()
    res = cli(config(tmp_path / "big", ["m1"], sweep=sweep), "--dry-run")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "expands to 1080000 (model, dataset) pairs" in lines[0] and "--dry-run --yes" in lines[0], lines[0]
    assert time.monotonic() - started < 30 and res.stdout == ""
    small = config(tmp_path / "small", ["m1"], sweep="sweep = dict(params={'models.batch_size': [1, 2, 3]}, "
                   "max_variants=2)")
    assert cli(small, "--dry-run").returncode == 2
    res = cli(small, "--dry-run", "--yes")
    assert res.returncode == 0, res.stderr
    assert "sweep: 12 (model, dataset) pair(s) over batch_size" in res.stdout and "m1[batch_size=3]" in res.stdout
    assert not (tmp_path / "small" / "out").exists()  # a plan writes nothing


def test_a_secret_swept_as_an_axis_is_refused_without_showing_it(tmp_path: Path) -> None:
    """The secret check looked at key names, and an axis is one dotted key
    (``models.generation_kwargs.api_key``): the value passed, and went into every variant's abbr
    (``m1[api_key=sk-...]``), so into file names, task ids in argv, logs and the summary."""
    secret = "sk-live-0123456789abcdef"
    for values in (f"[{secret!r}]", f"{{'live': {secret!r}}}", repr(secret)):
        cfg = config(tmp_path / str(len(values)), ["m1"],
                     sweep=f"sweep = dict(params={{'models.generation_kwargs.api_key': {values}}})")
        for args in ((), ("--dry-run",), ("--yes",)):
            res = cli(cfg, *args)
            lines = res.stderr.strip().splitlines()
            assert res.returncode == 2 and len(lines) == 1, res.stderr
            assert "axis 'models.generation_kwargs.api_key' sets a secret" in lines[0], lines[0]
            assert secret not in res.stderr + res.stdout
            assert not (tmp_path / str(len(values)) / "out").exists()


def test_long_abbrs_and_a_prompt_swept_as_a_list_run_and_resume(tmp_path: Path) -> None:
    """A list of prompt templates names each variant by its template (``add[prompt_template=...]``),
    and an abbr may be long: file names were the abbrs as they are, so a 300-character one failed
    every task with 'File name too long'.  Names are now cut to fit, with a hash that keeps them
    apart; the run finishes and -r finds everything done."""
    long_model = "model-" + "x" * 300
    step = "Answer the following question carefully, step by step, then give only the final number. " * 3
    cfg = config(tmp_path, [long_model], sweep="sweep = dict(params={'datasets.infer_cfg.prompt_template': "
                 f"[{step + '{question}'!r}, 'Q: {{question}}']}})")
    res = cli(cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    with open(run / "summary" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and all(r[long_model] not in ("", "-") for r in rows), rows  # 4 datasets x 2 prompts
    assert max(len(p.name) for p in run.rglob("*")) <= 220  # room for a temporary file's suffix in 255
    again = cli(cfg, "-r", "--dry-run")
    assert again.returncode == 0, again.stderr
    assert "[infer] 0 task(s) to run, 8 output(s) reused" in again.stdout, again.stdout


def test_a_saved_config_runs_again_and_an_edited_saved_sweep_is_one_line(tmp_path: Path) -> None:
    """A run's config.py holds its sweep expanded (``expanded=True``), read back as it is.  Run as
    a config of its own it plans the same variants; edited by hand, its values were trusted:
    ``max_variants='many'`` ended in a ValueError traceback."""
    cfg = config(tmp_path, ["m1"], sweep="sweep = dict(params={'models.batch_size': [1, 2]}, "
                 "baseline={'batch_size': 1})")
    assert cli(cfg).returncode == 0
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    saved = (run / "config.py").read_text()
    assert "'expanded': True" in saved
    again = cli(run / "config.py", "--dry-run", "-w", tmp_path / "again")
    assert again.returncode == 0, again.stderr
    assert "sweep: 8 (model, dataset) pair(s) over batch_size" in again.stdout, again.stdout
    edits = [("'max_variants': 50", "'max_variants': 'many'", "sweep.max_variants: expected an integer >= 1"),
             ("'axes': ['batch_size']", "'axes': 'batch_size'", "sweep.axes: expected a list of axis names"),
             ("'expanded': True", "'expanded': True, 'extra': 1", "unknown key 'extra' of a saved (expanded) sweep"),
             ("'base': 'm1'", "'base': 1", "sweep.variants.models: expected dict(models={abbr: dict(base=")]
    for i, (old, new, said) in enumerate(edits):
        assert old in saved, old
        edited = tmp_path / f"edited{i}.py"
        edited.write_text(saved.replace(old, new))
        res = cli(edited, "--dry-run", "-w", tmp_path / "again")
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and said in lines[0], res.stderr


def test_python_api_runs_resumes_and_reports(tmp_path: Path) -> None:
    cfg = config(tmp_path, ["m1", "m2"])
    view = orchestra.plan(cfg)
    assert len(view.tasks["infer"]) == 8 and not (tmp_path / "out").exists()  # a plan writes nothing
    first = orchestra.run(cfg, quiet=True, **{"infer.runner.max_num_workers": 1})
    assert first.ok and first.status == "done" and first.failed == []
    rows = first.rows()
    assert len(rows) == 8 and {r["model"] for r in rows} == {"m1", "m2"}
    with open(Path(first.run_dir) / "summary/summary.csv") as f:
        table = {(r["dataset"], m): float(r[m]) for r in csv.DictReader(f) for m in ("m1", "m2")}
    assert {(r["dataset"], r["model"]): r["value"] for r in rows} == pytest.approx(table)
    again = orchestra.run(cfg, reuse="latest", quiet=True)
    assert again.run_dir == first.run_dir and again.ok and again.results == []  # nothing left to do
    with pytest.raises(ConfigError, match="batch_size"):
        orchestra.run(cfg, quiet=True, **{"models.0.batch_size": 0})
    with pytest.raises(UserError, match="dotted keys"):
        orchestra.run(cfg, quiet=True, batch_size=2)


def test_python_api_takes_a_dict_and_names_failed_tasks(tmp_path: Path) -> None:
    files = write_data(tmp_path / "data")
    cfg = {
        "models": [{"type": "DeterministicModel", "abbr": "bad", "fail_always": True}],
        "datasets": [{"type": "JsonlDataset", "abbr": "add", "path": str(files["add"]),
                      "reader_cfg": {"input_columns": ["question"], "output_column": "answer"},
                      "infer_cfg": {"prompt_template": "{question}"}, "eval_cfg": {"evaluator": "numeric_match"}}],
        "work_dir": str(tmp_path / "out"),
    }
    run = orchestra.run(cfg, quiet=True)
    assert run.exit_code == 1 and run.status == "failed"
    assert [(r.stage, r.state.value) for r in run.failed] == [("infer", "failed"), ("eval", "skipped")]
    assert "configured to fail" in Path(run.failed[0].log_path).read_text()
    assert all(r["value"] is None for r in run.rows())


def test_the_documented_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/python-api.md's first example, run as written (in a scratch folder)."""
    text = (REPO / "docs" / "python-api.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)
    code = code.replace('"outputs/api_example"', repr(str(tmp_path / "api_example")))
    exec(compile(code, "docs/python-api.md", "exec"), {})
    assert len(list((tmp_path / "api_example").iterdir())) == 1


def test_a_secret_in_a_config_with_a_sweep_is_refused_before_a_message_could_quote_it(tmp_path: Path) -> None:
    """The sweep's size is checked before the config is validated, and its error for models that
    are not a list quoted them, secret and all ('got {..., 'api_key': 'sk-...'}')."""
    secret = "sk-live-quoted-0123456789"
    cfg = config(tmp_path, ["m1"], sweep="sweep = dict(params={'models.batch_size': [1, 2]})")
    cfg.write_text(cfg.read_text().replace("models = [dict(type=DeterministicModel, abbr='m1', batch_size=4)]",
                                           f"models = dict(type=DeterministicModel, abbr='m1', api_key={secret!r})"))
    res = cli(cfg, "--dry-run")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "models.api_key: secrets do not belong in a config" in lines[0], lines[0]
    assert secret not in res.stderr + res.stdout
