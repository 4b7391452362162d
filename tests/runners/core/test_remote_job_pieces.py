"""Core pieces a remote-job backend (DLC today) is built from: the private env file, the counted
CLI client, stop-and-confirm one job per call, and the task's exit-code file.  Real shells and
real client processes; ``stop_each`` against an in-process service (a unit test of one function)."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestra.cluster.client import CLIClient
from orchestra.envfile import remove_env_file, source_lines, write_env_file
from orchestra.privdir import UnsafeFolderError
from orchestra.runners.core import shell
from orchestra.runners.core.stop_each import UNKNOWN, outcome, stop_each


class ServiceError(RuntimeError):
    pass


# -- the private env file ---------------------------------------------------------------------------------
def test_env_file_is_private_replaces_an_open_one_and_is_sourced_by_path(tmp_path: Path) -> None:
    path = str(tmp_path / "private" / "infer.env")
    os.makedirs(os.path.dirname(path), mode=0o755)
    Path(path).write_text("export OLD=1\n")
    os.chmod(path, 0o644)
    write_env_file(path, ["TOKEN", "UNSET"], {"TOKEN": "a 'b' $c; d"})
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    lines = source_lines(path, "who deletes it")
    assert "a 'b'" not in " ".join(lines)
    script = "; ".join([*lines, 'printf %s "$TOKEN"', 'printf %s "${OLD-gone}"'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == "a 'b' $c; dgone"
    remove_env_file(path)
    remove_env_file(path)  # twice is fine
    res = subprocess.run(["bash", "-c", "; ".join([*lines, "echo never"])], capture_output=True, text=True)
    assert res.returncode == 97 and "never" not in res.stdout
    assert res.stderr.strip() == f"orchestra: cannot read {path} (who deletes it)"


def test_env_file_values_come_back_byte_for_byte_and_never_run(tmp_path: Path) -> None:
    """Values are data whatever they hold: quotes, newlines, ``$()``, backticks, a byte that is not
    UTF-8 (os.environ holds it as a surrogate escape: the whole write failed with UnicodeEncodeError,
    and a secret-looking variable is written unasked, so one such variable broke every sbatch launch),
    a large value, many variables."""
    marker = tmp_path / "ran"
    values = {
        "A_TOKEN": f"x'y\"z\n$(touch {marker})`touch {marker}`;${{HOME}} \\",
        "B_KEY": os.fsdecode(b"caf\xe9\xff-bytes"),
        "C_SECRET": "v" * 1_000_000,
        **{f"V_{i}": f"value {i}\n" for i in range(500)},
    }
    path = tmp_path / "private" / "s.env"
    write_env_file(str(path), list(values), values)
    for name in ("A_TOKEN", "B_KEY", "C_SECRET", "V_0", "V_499"):
        value = values[name]
        script = "; ".join([*source_lines(str(path), "test"), f'printf %s "${name}"'])
        out = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
        assert out.stdout == os.fsencode(value), name
    assert not marker.exists()


def test_env_file_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep")
    path = tmp_path / "private" / "s.env"
    path.parent.mkdir()
    os.symlink(target, f"{path}.{os.getpid()}.tmp")
    with pytest.raises(OSError):
        write_env_file(str(path), ["A"], {"A": "1"})
    assert target.read_text() == "keep"


def test_env_file_refuses_a_name_that_is_not_an_identifier(tmp_path: Path) -> None:
    """Names are written unquoted (``export NAME=...``): 'A;touch X' ran touch where it was sourced."""
    marker = tmp_path / "ran"
    path = tmp_path / "private" / "s.env"
    with pytest.raises(ValueError, match="must be identifiers"):
        write_env_file(str(path), [f"A;touch {marker};B"], {f"A;touch {marker};B": "1"})
    if path.exists():
        subprocess.run(["sh", "-c", f". {shlex.quote(str(path))}"], capture_output=True, check=False)
    assert not marker.exists()


# -- the CLI client ---------------------------------------------------------------------------------------
def test_client_counts_calls_and_names_the_call_not_its_argv(tmp_path: Path) -> None:
    client = CLIClient("svc", ("svc", str(tmp_path)), timeout_s=0.5, max_calls_per_s=100, abort=None,
                       error=ServiceError)
    assert client.run("get", ["sh", "-c", "echo out; echo err >&2; exit 4"]) == (4, "out\nerr\n")
    with pytest.raises(ServiceError) as info:
        client.run("get", ["sh", "-c", "sleep 30", "secret-arg"], what="get job 7")
    assert str(info.value) == ("svc get job 7 did not answer within cli_timeout_s=0.5 s; "
                               "killed it and its child processes")
    with pytest.raises(ServiceError, match="cannot run /nonexistent/svc"):
        client.run("stop", ["/nonexistent/svc"], urgent=True)
    assert client.calls == {"get": 2, "stop": 1}


def test_unpaced_client_keeps_stdout_and_stderr_apart_and_names_its_fixed_bound() -> None:
    client = CLIClient("slurm", "slurm-test", timeout_s=0.5, max_calls_per_s=None, abort=None, error=ServiceError,
                       timeout_name="")
    assert client.limiter is None
    started = time.monotonic()
    for _ in range(12):  # more than any bucket's burst: nothing waits its turn
        res = client.call("squeue", ["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert time.monotonic() - started < 5
    with pytest.raises(ServiceError) as info:
        client.call("scancel", ["sleep", "30"])
    assert str(info.value) == "slurm scancel did not answer within 0.5 s; killed it and its child processes"
    assert client.calls == {"squeue": 12, "scancel": 1}


def test_client_gives_up_an_abortable_call_after_a_stop_but_not_another() -> None:
    abort = threading.Event()
    client = CLIClient("svc", ("svc", "abort"), timeout_s=30, max_calls_per_s=100, abort=abort, error=ServiceError,
                       abort_grace_s=0.3)
    threading.Timer(0.2, abort.set).start()
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match="svc submit was still running when the run was stopped"):
        client.run("submit", ["sleep", "30"], abortable=True)
    assert time.monotonic() - t0 < 5
    assert client.run("stop", ["sh", "-c", "sleep 0.5; echo ok"], urgent=True) == (0, "ok\n")  # not abortable


def test_client_paces_calls_that_are_not_urgent() -> None:
    client = CLIClient("svc", ("svc", "pace"), timeout_s=10, max_calls_per_s=20, abort=None, error=ServiceError)
    t0 = time.monotonic()
    for _ in range(30):  # a burst of 20, then 10 more at 20 per second
        client.run("get", ["true"])
    assert time.monotonic() - t0 >= 0.4


# -- stop each job, confirmed -----------------------------------------------------------------------------
class Service:
    """Jobs that end ``lag_s`` after their stop; ``stuck`` ones never do, ``mute`` ones never answer."""

    def __init__(self, lag_s: float, stuck: set[str], mute: set[str]) -> None:
        self.lag_s, self.stuck, self.mute = lag_s, stuck, mute
        self.stopped: dict[str, float] = {}
        self.stops: dict[str, int] = {}
        self.lock = threading.Lock()

    def stop(self, job_id: str) -> None:
        with self.lock:
            self.stops[job_id] = self.stops.get(job_id, 0) + 1
            self.stopped.setdefault(job_id, time.monotonic())
        if job_id == "bad":
            raise ServiceError("refused")

    def state(self, job_id: str) -> str:
        if job_id in self.mute:
            raise ServiceError("no answer")
        since = self.stopped.get(job_id)
        if job_id in self.stuck or since is None:
            return "Running"
        return "Stopped" if time.monotonic() - since >= self.lag_s else "Stopping"


def test_stop_each_confirms_every_job_and_resends_to_one_still_running() -> None:
    service = Service(0.2, stuck={"s"}, mute={"m"})
    ids = ["a", "b", "a", "s", "m", "bad"]
    status = stop_each(ids, service.stop, service.state, terminal={"Stopped"}, ending={"Stopping"},
                       errors=(ServiceError,), timeout_s=1.5, resend_after_s=0.5, poll_s=0.05, concurrency=4,
                       name="t")
    assert status == {"a": "Stopped", "b": "Stopped", "s": "Running", "m": UNKNOWN, "bad": "Stopped"}
    assert service.stops["a"] == 1 and service.stops["s"] >= 2  # resent to the one still running
    assert [outcome(status[j], {"Stopped"}, {"Stopping"}) for j in ("a", "s", "m")] == [
        "stopped", "stop_unconfirmed", "stop_unconfirmed"]
    assert outcome("Stopping", {"Stopped"}, {"Stopping"}) == "stop_acknowledged"


def test_stop_each_of_nothing_calls_nothing() -> None:
    def never(_: str) -> str:
        raise AssertionError("called")

    assert stop_each([], never, never, terminal=(), ending=(), errors=(), timeout_s=1, resend_after_s=1,
                     poll_s=0.1, concurrency=1, name="t") == {}


# -- the task's exit code on a shared file system ---------------------------------------------------------
@pytest.mark.parametrize("code", [0, 3])
def test_exit_file_written_by_the_task_lines_is_read_back(tmp_path: Path, code: int) -> None:
    exit_file = str(tmp_path / "exit dir" / "job;1")
    lines = shell.task_lines(f"sh -c {shlex.quote(f'exit {code}')}", shell.printf("head"),
                             shell.printf("foot %s", shell.RC), exit_file=exit_file)
    res = subprocess.run(["sh", "-c", "\n".join(lines)], capture_output=True, text=True)
    assert res.returncode == code and shell.read_exit_file(exit_file) == code


def test_exit_file_that_is_missing_or_garbled_is_no_code(tmp_path: Path) -> None:
    assert shell.read_exit_file(str(tmp_path / "none")) is None
    (tmp_path / "g").write_text("12abc\n")
    assert shell.read_exit_file(str(tmp_path / "g")) is None
    (tmp_path / "n").write_text("-9\n")
    assert shell.read_exit_file(str(tmp_path / "n")) == -9


def test_env_file_folder_planted_as_a_link_is_refused_and_its_parent_closed(tmp_path: Path) -> None:
    """Another user who may write the folder above (``<run>/dlc``, made with the umask) plants
    ``private`` as a link to a folder of ours: it was followed (chmod 0700, the secret written
    there).  Now it is refused; and once written, the folder above is not writable by group or
    others, so nobody can swap ``private`` before the job sources the file."""
    dlc = tmp_path / "dlc"
    dlc.mkdir()
    dlc.chmod(0o777)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (dlc / "private").symlink_to(elsewhere)  # who owns the link does not matter: a link is never followed
    with pytest.raises(UnsafeFolderError, match=f"^{dlc / 'private'} is a symbolic link: the variables of forward_env"):
        write_env_file(str(dlc / "private" / "infer.env"), ["A"], {"A": "secret"})
    assert list(elsewhere.iterdir()) == [] and elsewhere.stat().st_mode & 0o777 == 0o755
    (dlc / "private").unlink()
    write_env_file(str(dlc / "private" / "infer.env"), ["A"], {"A": "secret"})
    assert dlc.stat().st_mode & 0o777 == 0o755 and (dlc / "private").stat().st_mode & 0o777 == 0o700


def test_env_file_under_a_folder_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    """The folder above the private one (``<run>/dlc``) is itself a link another user planted, to a
    folder they may write: it is refused, never chmod-ed through, and nothing is written there."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    (tmp_path / "dlc").symlink_to(theirs)
    with pytest.raises(UnsafeFolderError, match=f"^{tmp_path / 'dlc'} is not a real folder of this user"):
        write_env_file(str(tmp_path / "dlc" / "private" / "infer.env"), ["A"], {"A": "secret"})
    assert list(theirs.iterdir()) == [] and theirs.stat().st_mode & 0o777 == 0o777
