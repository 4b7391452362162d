"""What an lm-eval user meets in the first minute, through ``run.py`` with the real lm-eval probe:

- a misspelt task name is one line (exit 2) naming the config file, the key and the value, and
  lm-eval's closest task names;
- the shards of a group build its requests once per run (one infer task loads lm-eval's task,
  the others read the run's shared file), and a dataset without ``abbr`` is named after its
  task (the same run: its files are ``pair_<shard>.jsonl`` and ``pair.json``).

The tasks are tests/datasets/lmeval_toy.py's, answered by ``DeterministicModel``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.lmeval_seed import LmEvalIndex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmeval_toy as toy  # noqa: E402

sys.path.pop(0)


@pytest.mark.slow
def test_a_misspelt_task_is_one_line_with_lm_evals_closest_names(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    tasks = toy.write(tmp_path / "lay")
    cfg = toy.config(tmp_path / "cfg.py", tasks, tmp_path / "work",
                     "dict(type=LmEvalDataset, abbr='arc', task='arc_chalenge', include_path={tasks!r})")
    proc = toy.run(cfg, "--dry-run", environ=toy.env(lmeval_index.seed(tmp_path / "cache")))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    assert str(cfg) in line and "datasets[0]" in line and "task='arc_chalenge'" in line, line
    suggested = line.split("closest names: ", 1)[1].split(", ")
    assert suggested[0] == "arc_challenge", line  # lm-eval's stock task, the nearest name


def _imports_by_infer_tasks(lay: Path) -> int:
    """How often an infer task loaded the task folder (its ``!function`` module notes each import)."""
    lines = (lay / "shared" / "imported.jsonl").read_text().splitlines()
    return sum(1 for line in lines if "/tasks/infer_" in "".join(json.loads(line)["argv"]))


@pytest.mark.slow
def test_the_shards_of_a_group_build_its_requests_once_per_run(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    """Three shards of the group ``pair`` (no ``abbr``) in three infer tasks (two at a time): lm-eval loads
    the task folder and builds the requests in one of them; the others read the run's shared
    file (was: each shard built the whole group's requests itself)."""
    lay = tmp_path / "lay"
    tasks = toy.write(lay)
    work = tmp_path / "work"
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.fake import DeterministicModel\n"
        "from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        f"datasets = [dict(type=LmEvalDataset, task='pair', include_path={str(tasks)!r})]\n"
        "infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=3),\n"
        "             runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=InferTask)))\n"
        "eval = dict(partitioner=dict(type=NaivePartitioner),\n"
        "            runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=EvalTask)))\n"
        f"work_dir = {str(work)!r}\n"
    )
    proc = toy.run(cfg, environ=toy.env(lmeval_index.seed(tmp_path / "cache")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lmeval_index.untouched(tmp_path / "cache")  # the seeded index was read, not built again
    (run,) = work.iterdir()
    assert len(list((run / "predictions" / "det").glob("pair_*.jsonl"))) == 3  # three shards ran
    assert _imports_by_infer_tasks(lay) == 1
    (built,) = (run / "shared").glob("lmeval-*.jsonl")
    meta = json.loads(built.read_text().splitlines()[0])["_meta"]
    assert meta["count"] == 7  # every document of the group: small (2) and big (5)
    result = json.loads((run / "results" / "det" / "pair.json").read_text())
    assert result["metrics"]["exact_match,none"] == 1.0  # the shards' answers scored as one group
