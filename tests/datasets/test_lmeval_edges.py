"""LmEvalDataset at its edges, through ``run.py`` with the real lm-eval probe and tasks.

- ``-r`` follows every file a task reads (its data beside the task folder, a YAML it includes and
  the Python its ``!function`` names, both outside ``include_path``) and only those: an unrelated
  task's YAML in the same folder changes nothing.
- ``test_range`` is honoured as the planner counted it: a group's subtask with nothing in range
  contributes nothing, ``'[:-2]'`` drops each subtask's last two documents, and a range past the
  end of a task is one line at planning time.
- A ``num_fewshot`` lm-eval cannot draw is refused at planning time, in one line, exit 2.
- The planning probe (which imports the task's Python) runs without the orchestrator's secrets.

The tasks are tests/datasets/lmeval_toy.py's, answered by ``DeterministicModel``; each cache
starts with lm-eval's stock task index built once per session (``tests/lmeval_seed.py``). The real
runs keep one warm worker for both stages (``_warm``): their tasks share one process that imports
lm-eval and torch once, instead of a fresh one per task (~5 s of CPU each).
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lmeval_seed import LmEvalIndex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmeval_toy as toy  # noqa: E402

sys.path.pop(0)

ARITH = "dict(type=LmEvalDataset, abbr='arith', task='arith', include_path={tasks!r}{extra})"
#: one warm worker for both stages, the eval stage after the infer stage (so every eval task finds the worker)
WARM = """from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask
infer = dict(runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, task=dict(type=InferTask)))
eval = dict(overlap=False,
            runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, task=dict(type=EvalTask)))
"""


def _dataset(extra: str = "") -> str:
    return ARITH.replace("{extra}", extra)


def _warm(cfg: Path) -> Path:
    """``cfg`` run by one warm worker (:data:`WARM`): the tasks of a run import lm-eval once, not once each."""
    cfg.write_text(cfg.read_text() + WARM)
    return cfg


def _run_dir(work: Path) -> Path:
    (run,) = glob.glob(str(work / "*"))
    return Path(run)


def _result(work: Path, abbr: str) -> dict[str, Any]:
    return json.loads((_run_dir(work) / "results" / "det" / f"{abbr}.json").read_text())


def _details(work: Path, abbr: str) -> list[dict[str, Any]]:
    path = _run_dir(work) / "results" / "det" / f"{abbr}.details.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_reuse_follows_every_file_the_task_reads_and_only_those(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    lay = tmp_path / "lay"
    tasks = toy.write(lay)
    cfg = _warm(toy.config(tmp_path / "cfg.py", tasks, tmp_path / "work", _dataset()))
    env = toy.env(lmeval_index.seed(tmp_path / "cache"))
    first = toy.run(cfg, environ=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert lmeval_index.untouched(tmp_path / "cache")  # the seeded index was read, not built again
    assert _result(tmp_path / "work", "arith")["metrics"]["exact_match,none"] == 1.0

    # an unrelated task's YAML edited: everything is reused, and nothing is probed again
    other = tasks / "other.yaml"
    other.write_text(other.read_text() + "description: 'Answer: '\n")
    unrelated = toy.run(cfg, "-r", "--dry-run", environ=env)
    assert unrelated.returncode == 0, unrelated.stderr[-2000:]
    for stage in ("infer", "eval"):
        assert f"[{stage}] 0 task(s) to run, 1 output(s) reused" in unrelated.stdout, unrelated.stdout

    # the Python a !function of the included base YAML names, edited: arith runs again
    helpers = lay / "shared" / "helpers.py"
    kept = helpers.read_text()
    helpers.write_text(kept.replace('return doc["q"]', 'return doc["q"] + " "'))
    edited = toy.run(cfg, "-r", "--dry-run", environ=env)
    assert edited.returncode == 0, edited.stderr[-2000:]
    assert "[infer] 1 task(s) to run, 0 output(s) reused" in edited.stdout, edited.stdout
    helpers.write_text(kept)

    # every gold answer changed in the data file: -r scores the new data (was: the old 1.0 again)
    toy.write_data(lay, "arith", wrong=True)
    again = toy.run(cfg, "-r", environ=env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert _result(tmp_path / "work", "arith")["metrics"]["exact_match,none"] == 0.0

    # what the task reads, kept with the content key: the data beside the task folder, the base YAML
    # and its Python outside include_path, and not the other tasks of the folder
    (manifest,) = json.loads((tmp_path / "cache" / "lmeval_inputs.json").read_text()).values()
    assert {str(lay / p) for p in ("data/arith.jsonl", "shared/base.yaml", "shared/helpers.py",
                                   "tasks/arith.yaml")} <= set(manifest["files"])
    assert not any("other" in f or "small" in f for f in manifest["files"])


@pytest.mark.slow
def test_ranges_leave_empty_subtasks_out_and_count_from_the_end(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    tasks = toy.write(tmp_path / "lay")
    # arith's last two answers are wrong: evaluated, they would make its score 0.5
    rows = toy.rows(4)
    rows[2]["answer"] = rows[3]["answer"] = "wrong"
    (tmp_path / "lay" / "data" / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets = (_dataset(", test_range='[:-2]'") + ",\n"
                "dict(type=LmEvalDataset, abbr='pair', task='pair', include_path={tasks!r}, test_range='[3:5]')")
    cfg = _warm(toy.config(tmp_path / "cfg.py", tasks, tmp_path / "work", datasets))
    proc = toy.run(cfg, environ=toy.env(lmeval_index.seed(tmp_path / "cache")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert lmeval_index.untouched(tmp_path / "cache")
    work = tmp_path / "work"

    arith = _result(work, "arith")
    assert arith["metrics"]["exact_match,none"] == 1.0
    assert sorted(d["doc_id"] for d in _details(work, "arith")) == [0, 1]

    # small (2 documents) has none in [3:5]: it contributes nothing; big's documents 3 and 4 are the group
    pair = _result(work, "pair")
    assert pair["metrics"]["exact_match,none"] == 1.0
    assert set(pair["lmeval"]["n-samples"]) == {"big"}
    assert pair["lmeval"]["n-samples"]["big"]["effective"] == 2
    assert sorted((d["task"], d["doc_id"]) for d in _details(work, "pair")) == [("big", 3), ("big", 4)]


def test_a_range_past_the_end_is_one_line_at_planning(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    tasks = toy.write(tmp_path / "lay")
    cfg = toy.config(tmp_path / "cfg.py", tasks, tmp_path / "work", _dataset(", test_range='[10:20]'"))
    proc = toy.run(cfg, "--dry-run", environ=toy.env(lmeval_index.seed(tmp_path / "cache")))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "arith" in line and "test_range='[10:20]' selects no document" in line, line


@pytest.fixture(scope="module")
def too_many_shots(tmp_path_factory: pytest.TempPathFactory, lmeval_index: LmEvalIndex) -> dict[str, Any]:
    """``--dry-run`` of arith (4 documents, no few-shot split) with ``num_fewshot=50``, from an
    orchestrator whose environment holds API keys."""
    tmp = tmp_path_factory.mktemp("lmeval_shots")
    tasks = toy.write(tmp / "lay")
    cfg = toy.config(tmp / "cfg.py", tasks, tmp / "work", _dataset(", num_fewshot=50"))
    env = {**toy.env(lmeval_index.seed(tmp / "cache")), "OPENAI_API_KEY": "sk-probe-must-not-see",
           "MY_SERVICE_TOKEN": "t0k3n-secret", "HF_TOKEN": "hf_kept_for_the_hub"}
    proc = toy.run(cfg, "--dry-run", environ=env)
    imported = [json.loads(line) for line in (tmp / "lay" / "shared" / "imported.jsonl").read_text().splitlines()]
    return {"proc": proc, "imported": imported, "work": tmp / "work"}


def test_num_fewshot_larger_than_the_pool_is_one_line_at_planning(too_many_shots: dict[str, Any]) -> None:
    proc = too_many_shots["proc"]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "arith" in line and "num_fewshot=50" in line and "4 documents" in line, line
    assert not too_many_shots["work"].exists()  # nothing ran, no run folder


def test_the_planning_probe_runs_without_the_orchestrators_secrets(too_many_shots: dict[str, Any]) -> None:
    probes = [r for r in too_many_shots["imported"] if r["argv"] == ["probe"]]
    assert probes, too_many_shots["imported"]  # the probe imported the task's Python
    for record in probes:
        assert "OPENAI_API_KEY" not in record["env"] and "MY_SERVICE_TOKEN" not in record["env"], record
        assert {"PATH", "HF_HUB_OFFLINE", "HF_TOKEN"} <= set(record["env"]), record


def test_the_docs_say_planning_runs_the_task_folders_code() -> None:
    text = " ".join((toy.REPO / "docs" / "lm-eval.md").read_text().split())
    assert "Listing or planning a task folder runs its code, as lm-eval itself does" in text


def test_a_data_folder_lists_only_regular_files_for_the_content_key(tmp_path: Path) -> None:
    """A data folder a task's ``dataset_kwargs`` names, holding a FIFO and a link to
    ``/dev/zero`` beside its data: only the data is listed for the content key (before: both
    were, and hashing them blocked the planner forever, at every plan)."""
    import os

    from orchestra.datasets.lmeval_select import _files_under, _local_paths

    data = tmp_path / "data"
    data.mkdir()
    (data / "arith.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    os.mkfifo(data / "pipe")
    (data / "zero").symlink_to("/dev/zero")
    listed = [f for p in _local_paths({"data_dir": str(data), "split": "test"}) for f in _files_under(p)]
    assert listed == [str(data / "arith.jsonl")]
    assert [f for p in _local_paths(str(data / "*")) for f in _files_under(p)] == [str(data / "arith.jsonl")]


def test_a_data_files_glob_through_a_link_loop_ends(tmp_path: Path) -> None:
    """``data_files: data/**/*.jsonl`` where ``data`` holds two links to itself: Python's ``**``
    follows them (2**40 paths before ELOOP); the listing stops at MAX_GLOB_PATHS and ends (before:
    the probe never did)."""
    import os
    import subprocess

    data = tmp_path / "data"
    data.mkdir()
    (data / "arith.jsonl").write_text("{}\n")
    os.symlink(".", data / "a")
    os.symlink(".", data / "b")
    code = ("from orchestra.datasets.lmeval_select import _local_paths\n"
            "n = len(_local_paths({'data_files': 'data/**/*.jsonl'}))\n"
            "assert 1 <= n <= 100_000, n\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, timeout=45, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
