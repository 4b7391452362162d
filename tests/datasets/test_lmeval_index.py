"""lm-eval's stock task index, kept in orchestra's cache (orchestra/datasets/lmeval_index.py):
the TaskManager built from it is the one lm-eval builds itself, include_path overriding stock
names; the file is read back, a damaged one is built again, and planning that keeps no cache
(a report rebuilt with ``--mode viz``) writes none."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from orchestra.datasets import digest
from orchestra.datasets.lmeval_index import task_manager

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmeval_toy as toy  # noqa: E402

sys.path.pop(0)


def _include(tmp: Path) -> list[str]:
    """The toy task folder, with a task that takes a stock task's name (``arc_easy``)."""
    tasks = toy.write(tmp / "lay")
    (tasks / "arc_easy.yaml").write_text(toy.task_yaml(tmp / "lay", "arith").replace("task: arith", "task: arc_easy"))
    return [str(tasks)]


@pytest.mark.slow
def test_the_cached_index_is_lm_evals_and_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # the override of arc_easy is warned about
    monkeypatch.setenv("ORCHESTRA_CACHE_DIR", str(tmp_path / "cache"))
    include = _include(tmp_path)
    plain = TaskManager(include_path=include)
    first = task_manager(include)
    (cached,) = (tmp_path / "cache" / "lmeval_index").iterdir()
    again = task_manager(include)
    for tm in (first, again):
        assert tm.task_index == plain.task_index
        assert (tm.all_tasks, tm.all_subtasks, tm.all_groups, tm.all_tags) == (
            plain.all_tasks, plain.all_subtasks, plain.all_groups, plain.all_tags)
    assert len(plain.task_index) > 1000 and "mmlu" in plain.all_groups
    assert again.task_index["arc_easy"].yaml_path == Path(include[0]) / "arc_easy.yaml"
    assert {"arith", "pair", "arc_challenge"} <= set(again.all_tasks)
    assert set(again.load(["pair"])["tasks"]) == {"small", "big"}

    # what is read is the file: a stock entry changed in it shows in the next manager
    rows = json.loads(cached.read_text())
    (row,) = [r for r in rows if r[0] == "arc_challenge"]
    row[2] = "/elsewhere/arc_challenge.yaml"
    cached.write_text(json.dumps(rows))
    assert task_manager(include).task_index["arc_challenge"].yaml_path == Path("/elsewhere/arc_challenge.yaml")

    # a damaged file is built again (and written again)
    cached.write_text('[["arc_challenge", "NO_SUCH_KIND"')
    assert task_manager(include).task_index == plain.task_index
    assert json.loads(cached.read_text())[0][0] == rows[0][0]

    # the reference runs' index (tests/lmeval_reference.py: lm-eval's build one folder at a time, the stock
    # folder's kept for the session) is lm-eval's own, entry for entry and in its order: built, then read back
    from lm_eval.tasks import _index

    from tests import lmeval_reference

    monkeypatch.setenv(lmeval_reference._STOCK_INDEX, str(tmp_path / "session"))
    lm_evals_build = _index.TaskIndex.build
    for _process in ("first", "later"):
        monkeypatch.setattr(_index.TaskIndex, "build", lm_evals_build)  # a process of its own: nothing kept in memory
        lmeval_reference._index_built_once()
        assert list(TaskManager(include_path=include).task_index.items()) == list(plain.task_index.items())
    assert len(list((tmp_path / "session").glob("*.pickle"))) == 1


@pytest.mark.slow
def test_a_dry_run_writes_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest, "_PERSIST", [False])
    tm = task_manager(_include(tmp_path))
    assert "arith" in tm.all_tasks and "mmlu" in tm.all_groups
    assert not (tmp_path / "cache" / "lmeval_index").exists()
