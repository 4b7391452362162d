"""``-r`` after a SIGKILL of the orchestrator: sbatch jobs it left running are adopted, not submitted
again (real local cluster; every job of a run carries the run's name prefix, so squeue tells them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import REPO, jsonl, wait_for
from slurm_helpers import job_prefix, run_cli, run_dirs, squeue_jobs, start_cli, summary_rows, write_config

from orchestra.cluster.slurm import TERMINAL_STATES
from orchestra.runners.core.ledger import OVER, Ledger, spec_digest
from orchestra.runners.slurm.recover import recover
from orchestra.tasks.spec import TaskSpec

if TYPE_CHECKING:
    from conftest import SlurmCluster

pytestmark = pytest.mark.slurm

RUNNER = "type=SlurmRunner, launcher='sbatch', partition='debug', poll_interval_s=0.2, max_num_workers=16"


def test_an_sbatch_call_killed_before_its_job_id_was_recorded_is_found_by_name_and_cancelled(
        slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ledger says ``submitting`` and nothing after it for two jobs: the one Slurm has (a real job
    of that name) is cancelled and recorded with its id; for the other one warning says what to do."""
    spec = TaskSpec(stage="infer", task_id="infer_m_t0", run_dir="", model={"abbr": "m"}, model_abbr="m", units=())
    tag = uuid.uuid4().hex[:8]
    names = [f"orc-{tag}-infer_m_t0-a1", f"orc-{tag}-infer_m_t1-a1"]
    ledger = Ledger(str(tmp_path / "slurm"))
    for name in names:
        ledger.record("submitting", name, task_id=name.split("-")[2], stage="infer", attempt=1, digest="d")
    job_id = subprocess.run(["sbatch", "--parsable", f"--job-name={names[0]}", "--partition=debug",
                             f"--output={tmp_path}/%j.out", "--wrap", "sleep 300"],
                            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    try:
        kept: dict[str, object] = {}
        recover(ledger, [spec], 30, kept)
        assert kept == {}
        assert squeue_jobs(names[0]) == []
        unknown = {r["name"]: r["job_id"] for r in jsonl(Path(ledger.path)) if r["state"] == "submit_unknown"}
        assert unknown == {names[1]: ""}
        assert states(ledger, names[0])[1:] == [("stop_sent", job_id), ("stopped", job_id)]  # found by name
        assert f"the sbatch submission of {names[1]} was interrupted before its job id was known" in \
            capsys.readouterr().err
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)


#: a job that outlives scancel's SIGTERM: it ends at the SIGKILL that follows KillWait (5 s here)
DEAF = "trap '' TERM; while :; do sleep 0.2; done"


def deaf_job(name: str, tmp_path: Path) -> str:
    """A running job of this name that ignores SIGTERM."""
    job_id = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--partition=debug",
                             f"--output={tmp_path}/%j.out", "--wrap", DEAF],
                            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    wait_for(lambda: [j for j in squeue_jobs(name) if j[2] == "RUNNING"], 60, f"job {job_id} to run", every_s=0.2)
    return job_id


def recover_in_a_new_process(ledger: Ledger, stage: str, cancel_timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``recover`` as the next ``-r`` runs it: another process (claims are per process)."""
    code = ("import sys; from orchestra.runners.core.ledger import Ledger; "
            "from orchestra.runners.slurm.recover import recover; from orchestra.tasks.spec import TaskSpec; "
            "t = TaskSpec(stage=sys.argv[2], task_id='other', run_dir='', model={'abbr': 'm'}, model_abbr='m', "
            "units=()); kept = {}; recover(Ledger(sys.argv[1]), [t], float(sys.argv[3]), kept); print(kept)")
    return subprocess.run([sys.executable, "-c", code, os.path.dirname(ledger.path), stage, str(cancel_timeout_s)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def states(ledger: Ledger, name: str) -> list[tuple[str, str]]:
    return [(r["state"], r.get("job_id", "")) for r in jsonl(Path(ledger.path)) if r["name"] == name]


def test_an_unconfirmed_cancel_of_an_interrupted_sbatch_stays_for_the_next_resume(
        slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job the interrupted sbatch made is found by name and cancelled, but squeue still shows it
    (it ignores SIGTERM) when the 1 s deadline passes: the ledger keeps it possibly alive, with its
    id, the run names it, and the next ``-r`` (a new process) looks at it again."""
    name = f"orc-{uuid.uuid4().hex[:8]}-infer_m_t0-a1"
    ledger = Ledger(str(tmp_path / "slurm"))
    ledger.record("submitting", name, task_id="infer_m_t0", stage="infer", attempt=1, digest="d")
    job_id = deaf_job(name, tmp_path)
    try:
        spec = TaskSpec(stage="infer", task_id="infer_m_t0", run_dir="", model={"abbr": "m"}, model_abbr="m", units=())
        recover(ledger, [spec], 1, kept := {})
        assert kept == {}
        assert states(ledger, name)[1:] == [("stop_sent", job_id), ("stop_unconfirmed", job_id)]
        assert Ledger(str(tmp_path / "slurm")).jobs()[name].state not in OVER
        err = capsys.readouterr().err
        assert f"Slurm job(s) {job_id} ({name}) not shown gone 1 s after scancel: they may still be alive" in err
        again = recover_in_a_new_process(ledger, "infer", 30)
        assert again.returncode == 0 and again.stdout.strip() == "{}", again.stderr[-2000:]
        assert states(ledger, name)[3][0] in ("ended", "stop_sent")  # looked at again, by its id
        assert Ledger(str(tmp_path / "slurm")).jobs()[name].state in OVER
        assert [j for j in squeue_jobs(name) if j[2] not in TERMINAL_STATES] == []
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)


def test_an_interrupted_sbatch_squeue_cannot_look_for_stays_submitting(
        slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue fails (here: a Slurm config it cannot use): nothing is recorded, the run says the job
    may still be alive, and the next ``-r``, with squeue working, finds it by name and cancels it."""
    name = f"orc-{uuid.uuid4().hex[:8]}-infer_m_t0-a1"
    ledger = Ledger(str(tmp_path / "slurm"))
    ledger.record("submitting", name, task_id="infer_m_t0", stage="infer", attempt=1, digest="d")
    job_id = deaf_job(name, tmp_path)
    try:
        broken = tmp_path / "broken.conf"
        broken.write_text("")
        with monkeypatch.context() as m:
            m.setenv("SLURM_CONF", str(broken))
            spec = TaskSpec(stage="infer", task_id="t", run_dir="", model={"abbr": "m"}, model_abbr="m", units=())
            recover(ledger, [spec], 1, kept := {})
        assert kept == {}
        assert states(ledger, name) == [("submitting", "")]
        err = capsys.readouterr().err
        assert f"the sbatch submission(s) of {name} were interrupted" in err and "may still be alive" in err
        again = recover_in_a_new_process(ledger, "infer", 30)
        assert again.returncode == 0, again.stderr[-2000:]
        assert states(ledger, name)[1:] == [("stop_sent", job_id), ("stopped", job_id)]
        assert [j for j in squeue_jobs(name) if j[2] not in TERMINAL_STATES] == []
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)




def ledger(run: Path) -> list[dict]:
    return jsonl(run / "slurm/jobs.jsonl")


def test_resume_after_sigkill_adopts_running_sbatch_jobs_without_duplicates(slurm_cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    cfg = write_config(tmp_path, RUNNER, gpu=False, model=", delay_s=3.0")  # 3 infer tasks of ~15 s
    proc = start_cli(cfg)
    try:
        run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 60, "the run folder", every_s=0.2)
        prefix = job_prefix(run)
        running = wait_for(lambda: [j for j in squeue_jobs(prefix) if j[2] == "RUNNING"] if len(
            [j for j in squeue_jobs(prefix) if j[2] == "RUNNING"]) >= 3 else None, 90, "3 running jobs")
    finally:
        proc.kill()  # SIGKILL: nothing of the orchestrator runs any more
        proc.communicate(timeout=30)
    ids = sorted(j[0] for j in running)
    assert sorted(j[0] for j in squeue_jobs(prefix)) == ids  # batch jobs outlive their orchestrator
    submitted = {r["job_id"] for r in ledger(run) if r["state"] == "submitted"}
    assert submitted == set(ids)  # each recorded before anything relied on it

    res = run_cli(cfg, "-r", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary_rows(run)[("arith", "numeric_match")] == {"det": 1.0}
    adopted = [r for r in ledger(run) if r["state"] == "adopted"]
    assert sorted(r["job_id"] for r in adopted) == ids
    every = squeue_jobs(prefix, all_states=True)  # finished jobs stay listed (MinJobAge)
    assert len(every) == len({j[0] for j in every}) == 3 + 2  # 3 infer jobs, once each; 2 eval jobs
    submissions = [r["job_id"] for r in ledger(run) if r["state"] == "submitted"]
    assert len(submissions) == 3 + 2 and set(ids) < set(submissions)
    log = (run / "logs/infer").glob("*.log")
    assert all("===== slurm: adopted job " in p.read_text() for p in log)
    assert squeue_jobs(prefix) == []


def test_ctrl_c_with_fifty_sbatch_jobs_returns_within_seconds_and_leaves_none(slurm_cluster: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """50 jobs in flight (one array, most of them pending on the small cluster): one cancel for all,
    confirmed beside the loop; the CLI exits 130 within seconds and squeue shows none of them."""
    import signal

    from helpers import events

    cfg = write_config(tmp_path, RUNNER.replace("max_num_workers=16", "max_num_workers=64"), gpu=False,
                       max_task_size=6, model=", hang=True")  # 40 + 10 infer tasks of a few rows each
    proc = start_cli(cfg)
    try:
        run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 60, "the run folder", every_s=0.2)
        prefix = job_prefix(run)
        started = lambda: [e for e in events(run) if e["event"] == "started" and e["stage"] == "infer"]  # noqa: E731
        wait_for(lambda: len(started()) == 50 and len(
            [j for j in squeue_jobs(prefix) if j[2] == "RUNNING"]) >= 2, 120, "50 jobs in flight, some running")
    except BaseException:
        proc.send_signal(signal.SIGINT)  # its jobs hang: the orchestrator must cancel them
        proc.communicate(timeout=120)
        raise
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, err[-3000:]
    assert squeue_jobs(prefix) == [], "a job of the run is still in squeue"
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    cancelled = [e for e in events(run) if e["event"] == "cancelled" and e["stage"] == "infer"]
    assert len(cancelled) == 50 and all("attempt" in e for e in cancelled)  # each was in flight


def test_an_error_in_resumes_cancels_still_cancels_the_job_kept_for_adoption(
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sbatch jobs an earlier orchestrator left: one runs the very spec of this launch's task
    (kept for adoption), one another spec (cancelled as not needed).  That cancel goes out, then
    raises: ``open`` fails, and the launcher's close cancels the kept job rather than leave it running."""
    import errno

    from orchestra.events import EventLog
    from orchestra.paths import RunPaths
    from orchestra.runners.base import RunContext
    from orchestra.runners.core.ledger import spec_digest
    from orchestra.runners.slurm import batch  # imported (bound to the real cancel_records) before the patch
    from orchestra.runners.slurm import recover as recover_module
    from orchestra.runners.slurm.runner import SlurmRunner, run_tag

    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    prefix = f"orc-{run_tag(paths.root)}-"
    spec = TaskSpec(stage="infer", task_id="infer_m_t0", run_dir=paths.root, model={"abbr": "m"}, model_abbr="m",
                    units=())
    ledger = Ledger(paths.slurm_dir)
    ids = {}
    for task_id, digest in (("infer_m_t0", spec_digest(spec)), ("infer_m_t1", "another spec")):
        name = f"{prefix}{task_id}-a1"
        ledger.record("submitting", name, task_id=task_id, stage="infer", attempt=1, digest=digest)
        ids[task_id] = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--partition=debug",
                                       f"--output={tmp_path}/%j.out", "--wrap", "sleep 300"],
                                      capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        ledger.record("submitted", name, job_id=ids[task_id])
    real = recover_module.cancel_records

    def cancel_then_fail(records: list, led: Ledger | None, timeout_s: float, why: str) -> None:
        real(records, led, timeout_s, why)
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(recover_module, "cancel_records", cancel_then_fail)  # the -r step's cancel only
    assert batch.cancel_records is real
    try:
        with pytest.raises(OSError, match="injected"):
            SlurmRunner(launcher="sbatch", partition="debug", poll_interval_s=0.2).open(
                RunContext(paths, EventLog(paths.events)), [spec])
        assert squeue_jobs(prefix) == [], "the job kept for adoption was left running"
        reasons = {r["job_id"]: r.get("reason") for r in ledger_lines(ledger) if r["state"] == "stop_sent"}
        assert reasons == {ids["infer_m_t1"]: "left by an earlier orchestrator of this run folder, not needed",
                           ids["infer_m_t0"]: "the launch ended"}
    finally:
        subprocess.run(["scancel", *ids.values()], timeout=30, check=False)


def ledger_lines(ledger: Ledger) -> list[dict]:
    return jsonl(Path(ledger.path))


def test_resume_that_reuses_a_whole_stage_still_cancels_the_jobs_left_of_it(slurm_cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    """The orchestrator was killed after every infer output was sealed but before the ledger saw its
    jobs end (found by tests/e2e/test_chaos_cluster.py).  ``-r`` reuses every infer output, so it
    launches no infer task; the infer job still alive is cancelled and recorded all the same.
    Before: a stage with nothing to launch was never looked at, its job stayed in squeue and its
    ledger entry ``submitted`` for good."""
    cfg = write_config(tmp_path, RUNNER, gpu=False, datasets=("pick",))
    first = run_cli(cfg, "--mode", "infer")
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    prefix = job_prefix(run)
    name = f"{prefix}infer_det_pick-a2"  # as if a retry's job were still running at the kill
    led = Ledger(str(run / "slurm"))
    led.record("submitting", name, task_id="infer_det_pick", stage="infer", attempt=2, digest="d")
    job_id = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--partition=debug",
                             f"--output={tmp_path}/%j.out", "--wrap", "sleep 300"],
                            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    led.record("submitted", name, job_id=job_id)
    try:
        res = run_cli(cfg, "-r")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "[infer]" not in res.stderr  # no infer task launched
        assert squeue_jobs(prefix) == [], "the job left of the reused stage is still in squeue"
        assert states(led, name)[-1] == ("stopped", job_id)
        assert all(rec.state in OVER for rec in Ledger(str(run / "slurm")).jobs().values())
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)


def test_a_kill_between_an_arrays_submitted_lines_cancels_only_the_unknown_jobs_element(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The orchestrator is killed after sbatch answered, between the ``submitted`` lines of an array's
    jobs (found by tests/e2e/test_chaos_cluster.py in CI): the first two jobs' ids are known, the
    third's is not. ``-r`` adopts the two and cancels the third's element, ``_2``: its place in the
    call. Before: its place was counted among the unknown jobs only (``_0``), so -r cancelled the
    first task's element, recorded it as the third's, and the first task failed."""
    tag = uuid.uuid4().hex[:8]
    array = f"orc-{tag}-infer-{uuid.uuid4().hex[:8]}"
    specs = [TaskSpec(stage="infer", task_id=f"infer_m_t{i}", run_dir="", model={"abbr": "m"}, model_abbr="m",
                      units=()) for i in range(3)]
    names = [f"orc-{tag}-infer_m_t{i}-a1" for i in range(3)]
    ledger = Ledger(str(tmp_path / "slurm"))
    for spec, name in zip(specs, names):
        ledger.record("submitting", name, task_id=spec.task_id, stage="infer", attempt=1, digest=spec_digest(spec),
                      submitted_as=array)
    job_id = subprocess.run(["sbatch", "--parsable", f"--job-name={array}", "--partition=debug", "--array=0-2",
                             f"--output={tmp_path}/%A_%a.out", "--wrap", "sleep 300"],
                            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    try:
        for i in range(2):  # the kill lands before the third job's line
            ledger.record("submitted", names[i], job_id=f"{job_id}_{i}")
        wait_for(lambda: len(squeue_jobs(array)) == 3, 30, "the array's three elements in squeue")
        recover(ledger, specs, 30, kept := {})
        assert {t: r.job_id for t, r in kept.items()} == {"infer_m_t0": f"{job_id}_0", "infer_m_t1": f"{job_id}_1"}
        assert states(ledger, names[2])[1:] == [("stop_sent", f"{job_id}_2"), ("stopped", f"{job_id}_2")]
        assert sorted(j for j, _, _ in squeue_jobs(array)) == [f"{job_id}_0", f"{job_id}_1"]
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)


def test_an_array_whose_sbatch_call_was_killed_is_found_by_its_name_and_cancelled(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A SIGKILL inside the sbatch call of a job array (found by tests/e2e/test_chaos_cluster.py): the
    ledger has the ``submitting`` lines of its jobs, each with the array's name, and Slurm the array.
    ``recover`` finds the array by that name and cancels it, each element recorded for its own job.
    Before: it looked for the jobs' own names, found none, left the array running, and the resumed
    attempts failed on the checkpoints the array's tasks were still writing."""
    tag = uuid.uuid4().hex[:8]
    array = f"orc-{tag}-infer-{uuid.uuid4().hex[:8]}"
    names = [f"orc-{tag}-infer_m_t{i}-a1" for i in range(2)]
    ledger = Ledger(str(tmp_path / "slurm"))
    for i, name in enumerate(names):
        ledger.record("submitting", name, task_id=f"infer_m_t{i}", stage="infer", attempt=1, digest="d",
                      submitted_as=array)
    job_id = subprocess.run(["sbatch", "--parsable", f"--job-name={array}", "--partition=debug", "--array=0-1",
                             f"--output={tmp_path}/%A_%a.out", "--wrap", "sleep 300"],
                            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    try:
        spec = TaskSpec(stage="infer", task_id="other", run_dir="", model={"abbr": "m"}, model_abbr="m", units=())
        recover(ledger, [spec], 30, kept := {})
        assert kept == {}
        assert squeue_jobs(array) == [], "the array is still in squeue"
        for i, name in enumerate(names):
            assert states(ledger, name)[1:] == [("stop_sent", f"{job_id}_{i}"), ("stopped", f"{job_id}_{i}")]
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)
