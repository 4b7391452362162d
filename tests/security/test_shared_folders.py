"""Another local user cannot steer orchestra through the shared temporary folder.

The attacker's steps run as a real second user (``orchestra-hostile``, via ``setpriv``) in a
sticky, world-writable folder that stands in for /tmp (``TMPDIR``), so nothing here touches
the real ``/tmp/orchestra-<uid>``.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sec_helpers import REPO, as_hostile, cli_env, hostile_ids, run_cli, shared_tmp_folder, write_config

from orchestra.limits.concurrency import HostSlots
from orchestra.models import hf_load, weights_cache
from orchestra.privdir import UnsafeFolderError, private_dir
from orchestra.sandbox.sandbox import boxes_dir


@pytest.fixture
def shared() -> Iterator[Path]:
    yield from shared_tmp_folder()


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder of root's files that the attacker wants deleted (think /etc/cron.d)."""
    folder = tmp_path / "victim"
    folder.mkdir()
    for name in ("job-a", "job-b", "job-c"):
        (folder / name).write_text(f"{name}\n")
    return folder


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n{"question": "What is 3 + 4?", "answer": "7"}\n')
    return data


def _one_error_line(res: object) -> str:
    rc, out, err = res.returncode, res.stdout, res.stderr  # type: ignore[attr-defined]
    assert rc == 2, f"exit {rc}\nstdout: {out}\nstderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestra: error: "), err
    assert "Traceback" not in err
    return str(lines[0])


def test_members_link_planted_by_another_user_deletes_nothing_and_the_cli_refuses(
        tmp_path: Path, shared: Path, victim: Path, server: object) -> None:
    scope = f"openai-api:{server.base_url}|test-model"  # type: ignore[attr-defined]
    key = hashlib.sha256(scope.encode()).hexdigest()[:20]
    slots = shared / f"orchestra-{os.getuid()}" / "slots" / key
    as_hostile("mkdir", "-p", str(slots))
    as_hostile("ln", "-s", str(victim), str(slots / "members"))
    cfg = write_config(tmp_path, server.base_url, _data(tmp_path))  # type: ignore[attr-defined]
    res = run_cli(cfg, cli_env(tmp_path, TMPDIR=str(shared)))
    line = _one_error_line(res)
    uid, _ = hostile_ids()
    assert f"{shared}/orchestra-{os.getuid()} is owned by uid {uid}" in line, line
    assert "remove it, or set ORCHESTRA_LOCK_DIR to a folder of your own" in line
    assert sorted(p.name for p in victim.iterdir()) == ["job-a", "job-b", "job-c"]
    assert not (tmp_path / "out").exists()  # refused before a run folder was made


def test_a_slots_folder_of_another_user_is_refused_by_the_task_side_too(shared: Path, victim: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The code that makes the slot files checks on its own (the Python API, a task started by
    hand, a folder planted after the CLI looked): nothing is made, locked or removed there."""
    monkeypatch.setattr(tempfile, "tempdir", str(shared))  # what TMPDIR does for a new process
    monkeypatch.delenv("ORCHESTRA_LOCK_DIR")
    mine = shared / f"orchestra-{os.getuid()}"
    as_hostile("mkdir", str(shared / "attacker-slots"))
    as_hostile("ln", "-s", str(shared / "attacker-slots"), str(mine))
    with pytest.raises(UnsafeFolderError, match=f"{mine} is a symbolic link"):
        HostSlots("some-api", 4)
    assert os.listdir(shared / "attacker-slots") == []
    # A user-given lock folder that another user owns is refused, naming the variable to change.
    as_hostile("mkdir", str(shared / "theirs"))
    with pytest.raises(UnsafeFolderError, match="theirs is owned by uid .* set ORCHESTRA_LOCK_DIR"):
        HostSlots("some-api", 4, lock_dir=str(shared / "theirs"))
    # Our own folder that others may write is refused as well.
    open_dir = shared / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafeFolderError, match="open is writable by group and others"):
        HostSlots("some-api", 4, lock_dir=str(open_dir))


def test_member_count_removes_only_our_own_dead_member_files(tmp_path: Path, victim: Path) -> None:
    slots = HostSlots("count-me", 2, lock_dir=str(tmp_path / "locks"))
    members = Path(slots.dir) / "members"
    assert stat.S_IMODE(members.stat().st_mode) == 0o700
    uid, gid = hostile_ids()
    theirs = members / "1-deadbeef"
    theirs.write_text("")
    os.chown(theirs, uid, gid)  # an unlocked file that is not ours: not counted, never removed
    (members / "2-link").symlink_to(victim / "job-a")  # a link: never followed, never removed
    ours_dead = members / "3-cafebabe"
    ours_dead.write_text("")  # ours, unlocked: left by a dead process of ours, removed
    slots._register()
    assert slots._members == 1
    assert theirs.exists() and (members / "2-link").is_symlink() and not ours_dead.exists()
    assert (victim / "job-a").read_text() == "job-a\n"
    slots.close()


def test_sandbox_and_weights_folders_planted_by_another_user_are_refused(
        tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch, server: object) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(shared))  # what TMPDIR does for a new process
    monkeypatch.delenv("ORCHESTRA_SANDBOX_DIR", raising=False)
    sandbox = shared / f"orchestra-sandbox-{os.geteuid()}"
    weights = shared / f"orchestra-weights-{os.getuid()}"
    as_hostile("mkdir", "-p", str(sandbox), str(weights / "SmolLM2-planted"))
    with pytest.raises(UnsafeFolderError, match=f"{sandbox} is owned by uid"):
        boxes_dir(str(tmp_path / "locks" / "scope"))
    with pytest.raises(UnsafeFolderError, match=f"{weights} is owned by uid"):
        weights_cache.fallback_dir()
    # Through the CLI: one line, exit 2, before any run folder; then, the sandbox folder gone,
    # the weights folder (--dry-run checks too).
    cfg = write_config(tmp_path, server.base_url, _data(tmp_path))  # type: ignore[attr-defined]
    line = _one_error_line(run_cli(cfg, cli_env(tmp_path, TMPDIR=str(shared))))
    assert f"{sandbox} is owned by uid" in line and "set ORCHESTRA_SANDBOX_DIR" in line
    as_hostile("rmdir", str(sandbox))
    line = _one_error_line(run_cli(cfg, cli_env(tmp_path, TMPDIR=str(shared)), "--dry-run"))
    assert f"{weights} is owned by uid" in line and "set TMPDIR" in line
    assert not (tmp_path / "out").exists()


def test_torch_compile_of_a_local_model_never_uses_a_cache_folder_another_user_made(
        tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch, server: object) -> None:
    """torch.compile's default cache is ``<tmp>/torchinductor_<user>``, which torch uses whoever
    made it; it loads the shared libraries and pickled graphs it finds there.  A local model
    points it at ``<tmp>/orchestra-inductor-<uid>`` (0700, checked) unless the user chose one."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir  # torch imported, as by a model

    monkeypatch.setattr(tempfile, "tempdir", str(shared))  # what TMPDIR does for a new process
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # empty counts as unset; restored after the test
    theirs = shared / f"torchinductor_{getpass.getuser()}"
    as_hostile("mkdir", "-m", "777", str(theirs))  # torch's default, taken first
    hf_load.private_compile_cache()
    ours = shared / f"orchestra-inductor-{os.getuid()}"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(ours)
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700 and ours.stat().st_uid == os.geteuid()
    # where torch.compile reads and writes
    assert cache_dir() == str(ours) and triton_cache_dir(0).startswith(f"{ours}/")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(theirs))  # as torch writes its default back (`import evaluate`)
    hf_load.private_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(ours)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own choice is kept
    hf_load.private_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    # ours taken first by the other user: refused when a model loads, and by the CLI before a run
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    ours.rmdir()
    as_hostile("mkdir", "-m", "700", str(ours))
    with pytest.raises(UnsafeFolderError, match=f"{ours} is owned by uid"):
        hf_load.private_compile_cache()
    cfg = write_config(tmp_path, server.base_url, _data(tmp_path))  # type: ignore[attr-defined]
    line = _one_error_line(run_cli(cfg, cli_env(tmp_path, TMPDIR=str(shared)), "--dry-run"))
    assert f"{ours} is owned by uid" in line and "set TMPDIR" in line


def test_private_folders_are_made_0700_and_sandbox_roots_0711(tmp_path: Path, shared: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(shared))  # what TMPDIR does for a new process
    monkeypatch.delenv("ORCHESTRA_SANDBOX_DIR", raising=False)
    monkeypatch.delenv("ORCHESTRA_LOCK_DIR")
    old = os.umask(0)  # a umask of 0 must not open the folders up
    try:
        slots = HostSlots("made-private", 1)
        root = boxes_dir(slots.dir)
        weights = weights_cache.fallback_dir()
    finally:
        os.umask(old)
    mine = shared / f"orchestra-{os.getuid()}"
    for folder in (mine, mine / "slots", Path(slots.dir), Path(slots.dir) / "members", Path(weights)):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(Path(root).parent.stat().st_mode) == 0o711
    slot_file = Path(slots.dir) / "slot-0"
    assert slots._try_take() == 0 and stat.S_IMODE(slot_file.stat().st_mode) == 0o600
    slots.close()
    assert private_dir(str(mine), "slots") == str(mine / "slots")  # existing and ours: accepted


def test_a_cache_folder_another_user_can_write_is_refused_before_anything_is_read_from_it(
        tmp_path: Path, shared: Path, server: object) -> None:
    """``ORCHESTRA_CACHE_DIR`` on a shared path: another user who made the folder first, or can
    write it, could plant converted weights (loaded as the model) or file digests (a changed data
    file taken as unchanged). The CLI refuses such a folder in one line, --dry-run too."""
    cache = shared / "team-cache"
    planted = cache / "weights" / "SmolLM2-planted"
    as_hostile("mkdir", "-p", str(planted))
    as_hostile("touch", str(planted / weights_cache.MANIFEST), str(cache / "file_digests.json"))
    cfg = write_config(tmp_path, server.base_url, _data(tmp_path))  # type: ignore[attr-defined]
    uid, _ = hostile_ids()
    for args in ((), ("--dry-run",)):
        line = _one_error_line(run_cli(cfg, cli_env(tmp_path, ORCHESTRA_CACHE_DIR=str(cache)), *args))
        assert f"{cache} is owned by uid {uid}" in line, line
        assert "remove it, or set ORCHESTRA_CACHE_DIR to a folder of your own" in line, line
    assert not (tmp_path / "out").exists()  # refused before a run folder was made
    # A cache folder of ours that group and others may write: the fix is to close it.
    mine = tmp_path / "my-cache"
    mine.mkdir()
    mine.chmod(0o777)
    line = _one_error_line(run_cli(cfg, cli_env(tmp_path, ORCHESTRA_CACHE_DIR=str(mine)), "--dry-run"))
    assert f"{mine} is writable by group and others (mode 777)" in line and f"chmod go-w {mine}" in line, line


def test_converted_weights_are_never_loaded_from_a_folder_another_user_controls(
        tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task side checks on its own (the Python API, a folder planted after the CLI looked):
    a complete-looking entry in a folder of another user is refused, not returned to be loaded."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    theirs = shared / "weights"
    as_hostile("mkdir", str(theirs))
    entry = weights_cache.entry_for(str(gguf), str(theirs))
    as_hostile("mkdir", entry.path)
    as_hostile("touch", os.path.join(entry.path, weights_cache.MANIFEST))
    assert entry.is_complete()  # what the loader would have taken as the converted model

    def convert(out: str) -> None:
        raise AssertionError("nothing may be converted into a folder of another user")

    with pytest.raises(UnsafeFolderError, match=f"{theirs} is owned by uid"):
        weights_cache.get_or_convert(entry, convert, {"gguf": str(gguf)})
    monkeypatch.setenv("ORCHESTRA_CACHE_DIR", str(theirs))  # the default cache there: refused too
    with pytest.raises(UnsafeFolderError, match="set ORCHESTRA_CACHE_DIR"):
        weights_cache.default_cache_dir()


def test_a_new_cache_folder_is_made_private_whatever_the_umask(tmp_path: Path, server: object) -> None:
    """The cache a real run makes is 0700 even under ``umask 0`` (a folder group and others may
    write would be refused by the next run), and the next run uses it."""
    cache = tmp_path / "fresh" / "cache"
    cfg = write_config(tmp_path, server.base_url, _data(tmp_path))  # type: ignore[attr-defined]
    env = cli_env(tmp_path, ORCHESTRA_CACHE_DIR=str(cache))
    for _ in range(2):
        res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=180, preexec_fn=lambda: os.umask(0))
        assert res.returncode == 0, res.stderr
    assert (cache / "dataset_info.json").is_file()
    for folder in (tmp_path / "fresh", cache):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
