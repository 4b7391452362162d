"""A run folder (or its work dir) that another user owns or can write is refused, on start and
on ``-r``: its ledgers, replica lists and results are read back, so such a user could forge them.

The other user is real (``orchestra-hostile``, via ``setpriv``), acting in a sticky shared folder
as /tmp is; group/other write is a plain ``chmod``.  The CLI runs a tiny config against the test's
real OpenAI-compatible server.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sec_helpers import as_hostile, cli_env, hostile_ids, run_cli, shared_tmp_folder, the_run, write_config

from orchestra.paths import RUN_MARKER


@pytest.fixture
def shared() -> Iterator[Path]:
    yield from shared_tmp_folder()


def _config(folder: Path, base_url: str, work_dir: Path | None = None) -> Path:
    data = folder / "rows.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n')
    cfg = write_config(folder, base_url, data)
    if work_dir is not None:
        cfg.write_text(cfg.read_text().replace(repr(str(folder / "out")), repr(str(work_dir))))
    return cfg


def _cli(folder: Path, cfg: Path, *args: str, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    env = cli_env(folder, ORCHESTRA_LOCK_DIR=str(folder / "locks"))
    if umask is None:
        return run_cli(cfg, env, *args)
    old = os.umask(umask)  # the CLI inherits it
    try:
        return run_cli(cfg, env, *args)
    finally:
        os.umask(old)


def _refused(res: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The one error line of a refused run (exit 2, no traceback), which must hold ``parts``."""
    assert res.returncode == 2, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestra: error: "), res.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert "another user could forge the files orchestra reads back" in lines[0], lines[0]
    return lines[0]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def done_run(tmp_path: Path, server: Any) -> tuple[Path, Path]:
    """A finished run in a plain 0755 work dir made beforehand (config, run folder)."""
    (tmp_path / "out").mkdir(mode=0o755)
    cfg = _config(tmp_path, server.base_url)
    res = _cli(tmp_path, cfg)
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert _mode(tmp_path / "out") == _mode(run) == 0o755
    return cfg, run


def test_plain_0755_folders_are_used_on_start_and_on_reuse(tmp_path: Path, done_run: tuple[Path, Path]) -> None:
    cfg, run = done_run
    for args in (["-r"], ["-r", run.name], ["-r", str(run)], ["--mode", "viz"], ["--dry-run"]):
        res = _cli(tmp_path, cfg, *args)
        assert res.returncode == 0, (args, res.stderr)
    assert [p for p in (tmp_path / "out").iterdir()] == [run]  # -r used it; the dry run made nothing


WHO = {"o+w": "others", "g+w": "group"}


@pytest.mark.parametrize("who", sorted(WHO))
def test_a_run_folder_others_can_write_is_refused_on_reuse(tmp_path: Path, done_run: tuple[Path, Path],
                                                          who: str) -> None:
    cfg, run = done_run
    events = (run / "events.jsonl").read_bytes()
    subprocess.run(["chmod", who, str(run)], check=True)
    mode = f"{_mode(run):o}"
    for args in (["-r"], ["-r", run.name], ["-r", str(run)], ["--mode", "viz"], ["--mode", "eval"]):
        _refused(_cli(tmp_path, cfg, *args), f"run folder {run} is writable by {WHO[who]} (mode {mode})",
                 f"chmod go-w {run}")
    assert (run / "events.jsonl").read_bytes() == events  # nothing ran there


def test_viz_from_python_refuses_a_run_folder_others_can_write(tmp_path: Path, done_run: tuple[Path, Path]) -> None:
    """``orchestra.api.viz`` loads the folder's config.py: the Python API checks it as the CLI does."""
    from orchestra import api
    from orchestra.privdir import UnsafeFolderError

    _, run = done_run
    assert api.viz(str(run), quiet=True).exit_code == 0
    subprocess.run(["chmod", "o+w", str(run)], check=True)
    with pytest.raises(UnsafeFolderError, match=f"run folder {run} is writable by others"):
        api.viz(str(run), quiet=True)


def test_a_work_dir_others_can_write_is_refused_on_start_and_on_reuse(tmp_path: Path,
                                                                      done_run: tuple[Path, Path]) -> None:
    cfg, run = done_run
    out = tmp_path / "out"
    out.chmod(0o757)
    for args in ([], ["-r"], ["-r", run.name], ["--dry-run"]):
        _refused(_cli(tmp_path, cfg, *args), f"work dir {out} is writable by others (mode 757)", f"chmod go-w {out}")
    assert [p for p in out.iterdir()] == [run]  # no new run folder was made


def test_a_run_folder_that_is_a_symbolic_link_is_refused(tmp_path: Path, done_run: tuple[Path, Path]) -> None:
    cfg, run = done_run
    link = run.parent / "20990101_000000"  # the newest name: what -r takes
    link.symlink_to(run)
    for args in (["-r"], ["-r", link.name], ["-r", str(link)]):
        _refused(_cli(tmp_path, cfg, *args), f"run folder {link} is a symbolic link", "give the real path")


def test_a_run_folder_given_to_another_user_is_refused(tmp_path: Path, done_run: tuple[Path, Path]) -> None:
    cfg, run = done_run
    uid, gid = hostile_ids()
    os.chown(run, uid, gid)
    _refused(_cli(tmp_path, cfg, "-r"), f"run folder {run} is owned by uid {uid}, not by this user")


def test_a_run_folder_forged_by_another_user_is_refused(tmp_path: Path, shared: Path, server: Any) -> None:
    """The other user prepares a work dir and a complete-looking run folder in the shared folder;
    ``-r <that path>`` and a new run with that work dir both refuse it before anything runs."""
    theirs = shared / "evaluations"
    forged = theirs / "20250101_000000"
    as_hostile("mkdir", "-m", "755", str(theirs), str(forged))
    as_hostile("touch", str(forged / RUN_MARKER), str(forged / "config.py"))
    cfg = _config(tmp_path, server.base_url, work_dir=theirs)
    uid, _ = hostile_ids()
    for args in ([], ["-r"], ["-r", str(forged)]):
        _refused(_cli(tmp_path, cfg, *args), f"work dir {theirs} is owned by uid {uid}, not by this user",
                 "use a work dir of your own (-w)")
    assert sorted(p.name for p in theirs.iterdir()) == [forged.name]


def test_new_work_dirs_and_run_folders_are_made_without_group_or_other_write(tmp_path: Path, server: Any) -> None:
    """Under ``umask 000`` too: the work dir and the run folder come out 0755 (the files inside
    still follow the umask, tests/security/test_umask.py)."""
    work = tmp_path / "deep" / "out"
    cfg = _config(tmp_path, server.base_url, work_dir=work)
    res = _cli(tmp_path, cfg, umask=0)
    assert res.returncode == 0, res.stderr
    (run,) = list(work.iterdir())
    assert _mode(work.parent) == _mode(work) == _mode(run) == 0o755
    assert _cli(tmp_path, cfg, "-r", umask=0).returncode == 0


def test_a_work_dir_inside_a_folder_anyone_can_write_is_refused(tmp_path: Path, shared: Path, server: Any) -> None:
    """Our own 0755 work dir, but in a 0777 folder without the sticky bit: any user may rename it
    away after the check and put a forged one in its place, so it is refused; in the sticky
    shared folder (as /tmp) the same work dir is used."""
    open_folder = shared / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    work = open_folder / "out"
    work.mkdir(mode=0o755)
    cfg = _config(tmp_path, server.base_url, work_dir=work)
    for args in ([], ["--dry-run"]):
        _refused(_cli(tmp_path, cfg, *args), f"work dir {work} is inside {open_folder}, which others can write "
                 "(mode 777, not sticky)", "use a work dir of your own (-w)")
    assert list(work.iterdir()) == []
    open_folder.chmod(0o1777)
    assert _cli(tmp_path, cfg).returncode == 0


def test_a_work_dir_reached_through_another_users_link_is_refused(tmp_path: Path, shared: Path,
                                                                 server: Any) -> None:
    """The other user's symbolic link points at our own folder, so the folder passes; but its owner
    may point it at a forged run folder at any time, so the path is refused."""
    ours = shared / "ours"
    ours.mkdir(mode=0o755)
    link = shared / "evaluations"
    as_hostile("ln", "-s", str(ours), str(link))
    cfg = _config(tmp_path, server.base_url, work_dir=link)
    uid, _ = hostile_ids()
    for args in ([], ["--dry-run"]):
        _refused(_cli(tmp_path, cfg, *args), f"work dir {link} goes through {link}, a symbolic link owned by uid {uid}",
                 "give the real path")
    assert list(ours.iterdir()) == []
    own_link = shared / "mine"
    own_link.symlink_to(ours)  # a link of our own to a folder of ours is fine
    assert _cli(tmp_path, _config(tmp_path, server.base_url, work_dir=own_link)).returncode == 0


def test_r_latest_is_the_last_run_started_even_past_ten_in_one_second(tmp_path: Path) -> None:
    """Runs started in one second are ``<stamp>``, ``<stamp>_1``, ...; ``-r`` took the greatest
    name, so ``_9`` over ``_10`` (twelve runs a script starts at once)."""
    from orchestra.paths import choose_run_folder

    work = tmp_path / "out"
    names = ["20260101_000000", *(f"20260101_000000_{n}" for n in range(1, 12))]
    for name in names:
        (work / name).mkdir(parents=True, mode=0o755)
        (work / name / RUN_MARKER).touch()
    os.chmod(work, 0o755)
    assert choose_run_folder(str(work), "latest") == (str(work / "20260101_000000_11"), True)
    (work / "20260101_000001").mkdir(mode=0o755)  # the next second is later still
    assert choose_run_folder(str(work), "latest", create=False)[0] == str(work / "20260101_000001")


def test_r_of_a_folder_orchestra_did_not_make_and_viz_of_no_run_are_one_line(tmp_path: Path, server: Any) -> None:
    cfg = _config(tmp_path, server.base_url)
    res = _cli(tmp_path, cfg, "--mode", "viz")  # nothing to rebuild: no run yet
    assert res.returncode == 2 and res.stderr == f"orchestra: error: no run folder in {tmp_path / 'out'} to reuse\n"
    (tmp_path / "out" / "mine").mkdir(parents=True, mode=0o755)
    (tmp_path / "out" / "mine" / "notes.txt").write_text("a folder of the user's own")
    res = _cli(tmp_path, cfg, "-r", "mine")
    assert res.returncode == 2, res.stderr
    assert res.stderr == (f"orchestra: error: -r mine: {tmp_path / 'out' / 'mine'} is not a run folder of orchestra "
                          f"(no {RUN_MARKER} marker); give the timestamp of a run in {tmp_path / 'out'} or the path "
                          "of a run folder\n")
    assert sorted(os.listdir(tmp_path / "out" / "mine")) == ["notes.txt"]  # untouched
    res = _cli(tmp_path, cfg, "-r")  # no earlier run: a new one
    assert res.returncode == 0, res.stderr
    assert f"orchestra: no earlier run in {tmp_path / 'out'}; starting a new one" in res.stderr
    assert len([p for p in (tmp_path / "out").iterdir() if (p / RUN_MARKER).exists()]) == 1
