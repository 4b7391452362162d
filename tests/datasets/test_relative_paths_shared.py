"""A relative data path looked up in the folders above a config never lands on an entry another
local user planted in a shared folder (``/tmp/tasks`` for a config in ``/tmp/me/configs``), and a
``~`` path is the home folder's, not a folder named ``~`` where orchestra runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra.config import validate

NOBODY = 65534


def _raw(**dataset: object) -> dict:
    return {"models": [{"type": "DeterministicModel", "abbr": "det"}], "datasets": [dataset]}


def _shared(tmp_path: Path) -> tuple[Path, Path]:
    """A world-writable sticky folder like /tmp, a user's config two folders below it, and a
    working folder that holds none of the paths."""
    assert os.geteuid() == 0, "these tests plant entries owned by 'nobody': they run as root"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    source = shared / "me" / "configs" / "eval.py"
    source.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return shared, source


def test_an_include_path_planted_by_another_user_above_the_config_is_not_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared, source = _shared(tmp_path)
    planted = shared / "tasks"
    planted.mkdir()
    (planted / "evil.yaml").write_text("task: arc_easy\n")
    os.chown(planted, NOBODY, NOBODY)
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = validate(_raw(type="LmEvalDataset", abbr="arc", task="arc_easy", include_path="tasks"), str(source))
    assert cfg.datasets[0]["include_path"] == "tasks"  # left as given: the dataset says it is not a folder


def test_a_data_path_through_a_link_planted_by_another_user_is_not_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared, source = _shared(tmp_path)
    target = tmp_path / "theirs.jsonl"
    target.write_text('{"question": "1+1", "answer": "2"}\n')
    link = shared / "data"
    (tmp_path / "theirs").mkdir()
    os.symlink(tmp_path / "theirs", link)
    os.lchown(link, NOBODY, NOBODY)
    os.rename(target, tmp_path / "theirs" / "qa.jsonl")
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = validate(_raw(type="JsonlDataset", abbr="qa", path="data/qa.jsonl",
                        reader_cfg={"input_columns": ["question"], "output_column": "answer"},
                        infer_cfg={"prompt_template": "{question}"}), str(source))
    assert cfg.datasets[0]["path"] == "data/qa.jsonl"  # left as given: the dataset reports it missing


def test_the_user_s_own_folder_above_the_config_is_still_searched(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    shared, source = _shared(tmp_path)
    tasks = shared / "me" / "tasks"
    tasks.mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = validate(_raw(type="LmEvalDataset", abbr="arc", task="arc_easy", include_path=["tasks"]), str(source))
    assert cfg.datasets[0]["include_path"] == [os.fspath(tasks)]


def test_a_tilde_path_is_the_home_folder_s_not_a_folder_named_tilde(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "tasks").mkdir(parents=True)
    work = tmp_path / "work"
    (work / "~" / "tasks").mkdir(parents=True)  # a folder named '~' (a quoting slip) where orchestra runs
    monkeypatch.setenv("HOME", os.fspath(home))
    monkeypatch.chdir(work)
    cfg = validate(_raw(type="LmEvalDataset", abbr="arc", task="arc_easy", include_path="~/tasks"),
                   str(work / "eval.py"))
    assert cfg.datasets[0]["include_path"] == "~/tasks"
