"""SlurmRunner(forward_env=[...]) on the real local cluster: the job gets the variable; its value is in
no process's argv while the job runs, in no file of the run folder, in nothing the CLI printed, and
in nothing slurmctld keeps of the jobs (its StateSaveLocation, where it saves a batch job's
environment, and what ``scontrol`` shows of them)."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import wait_for
from slurm_helpers import job_prefix, run_cli, run_dirs, squeue_jobs, start_cli, write_config

if TYPE_CHECKING:
    from conftest import SlurmCluster

pytestmark = pytest.mark.slurm
SECRET = f"hf_sl0rm-S3CRET-{secrets.token_hex(6)}"  # unique: slurmctld keeps the jobs of earlier runs
UNNAMED = f"sk-unnamed-{secrets.token_hex(6)}"


@pytest.mark.parametrize("launcher", ["srun", "sbatch"])
def test_forwarded_variable_reaches_the_job_and_nothing_else(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, launcher: str) -> None:
    seen = tmp_path / "seen"
    # Inside the job: the hash of what $ORC_FWD_TOKEN holds there, and every process's argv at that moment
    # (srun, the job's shell, the task), then the task itself.
    probe = ('printf %s "$ORC_FWD_TOKEN" | sha256sum >> "$0"; printf %s "$ORC_UNNAMED_API_KEY" | sha256sum >> "$0"; '
             'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f"; echo; done >> "$0.argv" 2>/dev/null; exec "$@"')
    runner = (f"type=SlurmRunner, launcher={launcher!r}, partition='debug', poll_interval_s=0.2, "
              f"forward_env=['ORC_FWD_TOKEN'], template={['bash', '-c', probe, str(seen), '{task_cmd}']!r}")
    cfg = write_config(tmp_path, runner, gpu=False, datasets=("pick",))
    monkeypatch.setenv("ORC_FWD_TOKEN", SECRET)
    # A secret-looking variable that forward_env does not name (a model's key_env): Slurm's default export
    # would carry it, and store it with a batch job (before: in StateSaveLocation); it goes privately too.
    monkeypatch.setenv("ORC_UNNAMED_API_KEY", UNNAMED)
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    hashes = [line.split()[0] for line in seen.read_text().splitlines()]
    digests = [hashlib.sha256(v.encode()).hexdigest() for v in (SECRET, UNNAMED)]
    assert hashes == digests * 2  # the infer job and the eval job
    argv = (tmp_path / "seen.argv").read_text()
    assert "orchestra.tasks" in argv and SECRET not in argv and UNNAMED not in argv
    assert SECRET not in res.stdout + res.stderr and UNNAMED not in res.stdout + res.stderr
    (run,) = run_dirs(tmp_path)
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes() and UNNAMED.encode() not in path.read_bytes(), path
    assert not (run / "slurm" / "private").exists() or not any((run / "slurm" / "private").iterdir())
    saved = slurm_cluster.saved_state()
    assert saved, "slurmctld saved nothing: the check below would prove nothing"
    # before the private file: each sbatch job's saved 'environment' held it
    assert [p for p, data in saved.items() if SECRET.encode() in data or UNNAMED.encode() in data] == []
    for job in run_job_ids(run):
        shown = subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True, text=True, check=True)
        script = subprocess.run(["scontrol", "write", "batch_script", job, "-"], capture_output=True, text=True,
                                check=False)
        seen_by_scontrol = shown.stdout + script.stdout + script.stderr
        assert (SECRET in seen_by_scontrol or UNNAMED in seen_by_scontrol) is False


def test_ctrl_c_of_an_sbatch_run_deletes_the_private_file(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """While the jobs run, the secret is in <run>/slurm/private/<stage>.env (0600 in 0700); Ctrl-C
    cancels them and deletes the file, leaving no secret at rest in the run folder."""
    monkeypatch.setenv("ORC_UNNAMED_API_KEY", UNNAMED)
    runner = "type=SlurmRunner, launcher='sbatch', partition='debug', poll_interval_s=0.2"
    cfg = write_config(tmp_path, runner, gpu=False, datasets=("pick",), model=", hang=True")
    proc = start_cli(cfg)
    try:
        run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 30, "the run folder")
        wait_for(lambda: [j for j in squeue_jobs(job_prefix(run)) if j[2] == "RUNNING"], 60, "a running job")
        private = run / "slurm" / "private"
        # eval waits beside: its launch opens (writing eval.env) in a thread of its own once the infer
        # stage's first round was submitted, so possibly a moment after that job runs
        wait_for(lambda: sorted(p.name for p in private.iterdir()) == ["eval.env", "infer.env"], 30,
                 "both stages' private files")
        assert os.stat(private).st_mode & 0o777 == 0o700 and os.stat(private / "infer.env").st_mode & 0o777 == 0o600
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert list(private.iterdir()) == [] and squeue_jobs(job_prefix(run)) == []


def test_the_private_file_a_sigkilled_launch_left_is_deleted_by_the_next_one(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL leaves <run>/slurm/private/<stage>.env; the -r that follows deleted it only if it had
    secret-looking variables to write again (before: without them it stayed, a secret at rest)."""
    from orchestra.secretnames import secret_variables

    for name in secret_variables(os.environ):
        monkeypatch.delenv(name)
    cfg = write_config(tmp_path, "type=SlurmRunner, launcher='sbatch', partition='debug', poll_interval_s=0.2",
                       gpu=False, datasets=("pick",))
    assert run_cli(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    private = run / "slurm" / "private"
    private.mkdir(mode=0o700, exist_ok=True)
    (private / "infer.env").write_text(f"export ORC_OLD_TOKEN={UNNAMED}\n")
    os.chmod(private / "infer.env", 0o600)
    (run / "predictions" / "det" / "pick.jsonl").unlink()  # -r has an infer task to launch
    again = run_cli(cfg, "-r")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (run / "predictions" / "det" / "pick.jsonl").exists() and list(private.iterdir()) == []


def run_job_ids(run: Path) -> list[str]:
    """The ids of the Slurm jobs of this run folder that Slurm still knows."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%j"], capture_output=True, text=True,
                         check=True).stdout
    ids = [line.split("|")[0] for line in out.splitlines() if line.split("|")[-1].startswith(job_prefix(run))]
    assert ids, "no job of the run is known to Slurm"
    return ids


def test_forward_env_and_an_export_option_exclude_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.runners.slurm.runner import SlurmRunner

    monkeypatch.setenv("ORC_FWD_TOKEN", SECRET)
    with pytest.raises(ValueError, match="--export"):
        SlurmRunner(forward_env=["ORC_FWD_TOKEN"], extra_args="--export=NONE")
    with pytest.raises(ValueError, match="ORC_NOT_SET_ANYWHERE not set"):
        SlurmRunner(forward_env=["ORC_NOT_SET_ANYWHERE"])
    assert SlurmRunner(forward_env=["ORC_FWD_TOKEN"]).options.extra_args[-1] == "--export=ALL"


def test_private_variables_follow_the_export_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secret-looking variables go through the private file only where Slurm would export them all."""
    from orchestra.runners.slurm.runner import SlurmRunner

    monkeypatch.setenv("ORC_FWD_TOKEN", SECRET)
    monkeypatch.setenv("ORC_UNNAMED_API_KEY", UNNAMED)
    monkeypatch.delenv("SBATCH_EXPORT", raising=False)
    runner = SlurmRunner(launcher="sbatch", forward_env=["ORC_FWD_TOKEN"])
    assert runner.private_variables()[0] == "ORC_FWD_TOKEN" and "ORC_UNNAMED_API_KEY" in runner.private_variables()
    assert "PATH" not in runner.private_variables()
    limited = SlurmRunner(launcher="sbatch", forward_env=["ORC_FWD_TOKEN"], extra_args=["--export=NONE"])
    assert limited.private_variables() == ("ORC_FWD_TOKEN",)
    monkeypatch.setenv("SBATCH_EXPORT", "NONE")
    assert SlurmRunner(launcher="sbatch").private_variables() == ()
