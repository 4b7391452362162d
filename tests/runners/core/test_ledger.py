"""The durable job ledger's recovery, shared by Slurm, DLC and Ray: what an earlier orchestrator
left (``Ledger.left_behind``) and what becomes of each job (``triage``)."""

from __future__ import annotations

from pathlib import Path

from orchestra.runners.core.ledger import JobRecord, Ledger, triage


def test_left_behind_claims_what_may_be_alive_once(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "slurm"))
    ledger.record("submitting", "j1", task_id="a", stage="infer")  # killed inside sbatch: no id
    ledger.record("submitting", "j2", task_id="b", stage="infer")
    ledger.record("submitted", "j2", job_id="12")
    ledger.record("submitting", "j3", task_id="c", stage="infer")
    ledger.record("submitted", "j3", job_id="13")
    ledger.record("ended", "j3", job_id="13")  # over: nothing to do
    ledger.record("submitting", "j4", task_id="d", stage="eval")
    ledger.record("submitted", "j4", job_id="14")
    ledger.claim(["j5"])  # a launch of this process submits j5: never another's to stop
    ledger.record("submitting", "j5", task_id="e", stage="infer")
    ledger.record("submitted", "j5", job_id="15")
    interrupted, known = ledger.left_behind("infer")
    assert [r.name for r in interrupted] == ["j1"] and [(r.name, r.job_id) for r in known] == [("j2", "12")]
    assert ledger.left_behind("infer") == ([], [])  # claimed: a second launch of the stage leaves them
    assert [r.name for r in ledger.left_behind()[1]] == ["j4"]  # None: every stage


def rec(name: str, task_id: str, seq: int, digest: str = "d", state: str = "submitted") -> JobRecord:
    return JobRecord(name, task_id=task_id, stage="infer", attempt=1, seq=seq, digest=digest, job_id=name, state=state)


def test_triage_adopts_the_latest_alive_job_of_the_same_spec_and_stops_the_rest() -> None:
    known = [rec("a1", "a", 1), rec("a2", "a", 2), rec("b1", "b", 1, digest="old"), rec("c1", "c", 1),
             rec("d1", "d", 1), rec("e1", "e", 1, state="stop_sent"), rec("f1", "f", 1)]
    seen = {"a1": "alive", "a2": "alive", "b1": "alive", "c1": "over", "d1": None, "e1": "alive", "f1": "ending"}
    over, adopt, stop = triage(known, seen, {"a": "d", "b": "d", "d": "d", "e": "d", "f": "d"})
    assert [r.name for r in over] == ["c1"]
    assert [r.name for r in adopt] == ["a2"]  # one per task, its latest attempt
    # an older attempt, another spec, no answer, a job being stopped: each is stopped
    assert sorted(r.name for r in stop) == ["a1", "b1", "d1", "e1", "f1"]


def test_triage_adopts_a_job_of_a_wanted_task_that_ended_after_the_plan() -> None:
    """The launch planned task ``a`` to do while its job still ran; by the look the job is over
    (its end never seen by an orchestrator): the task's attempt takes that job and reports its
    end, and is not submitted again.  Older jobs of the task, another spec's, one whose end an
    orchestrator saw, or one it was stopping, are only recorded over."""
    known = [rec("a1", "a", 1), rec("a2", "a", 2), rec("b1", "b", 1, digest="old"), rec("c1", "c", 1, state="ended"),
             rec("e1", "e", 1, state="stop_sent"), rec("g1", "g", 1, state="adopted")]
    seen = {"a1": "over", "a2": "over", "b1": "over", "c1": "over", "e1": "over", "g1": "over"}
    over, adopt, stop = triage(known, seen, {"a": "d", "b": "d", "c": "d", "e": "d", "g": "d"})
    assert [r.name for r in adopt] == ["a2", "g1"]
    assert sorted(r.name for r in over) == ["a1", "b1", "c1", "e1"] and stop == []


FULL_DISK_WRITER = """
import os, resource, sys
from orchestra.runners.core.ledger import Ledger
ledger = Ledger(sys.argv[1])
ledger.record("submitted", "job-a", job_id="1")
room = os.path.getsize(ledger.path) + 20  # the next line is torn 20 bytes in, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (room, room))
try:
    ledger.record("submitting", "job-b", task_id="t" * 60, stage="infer")
except OSError as exc:
    print("refused:", exc)
else:
    print("taken as recorded")
"""


def test_a_line_the_disk_tears_raises_and_never_spoils_the_next_record(tmp_path: Path) -> None:
    """A full disk cuts a ledger line short without an error (the error comes with the next
    write): the record was taken as made, so the job it guards was submitted unrecorded, and the
    next line, appended after the torn bytes, was lost too (after a SIGKILL, ``-r`` knew
    neither job).  Now the torn record raises, and the next one is a line of its own."""
    import subprocess
    import sys

    folder = tmp_path / "slurm"
    res = subprocess.run([sys.executable, "-c", FULL_DISK_WRITER, str(folder)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("refused:") and str(folder / "jobs.jsonl") in res.stdout, res.stdout
    ledger = Ledger(str(folder))  # the disk has room again
    ledger.record("submitted", "job-c", job_id="3")
    jobs = ledger.jobs()
    assert jobs["job-a"].job_id == "1" and jobs["job-c"].job_id == "3" and "job-b" not in jobs


#: a Slurm ledger as main (before orchestra.journal) wrote it: lines from Ledger.record and record_stop
OLD_LEDGER = """\
{"ts": 1795925149.307, "state": "submitting", "name": "orc-5f3a-infer-infer_m_t0-1", "task_id": "infer_m_t0", \
"stage": "infer", "attempt": 1, "digest": "9c1e0d2b7a4f6e13"}
{"ts": 1795925149.309, "state": "submitted", "name": "orc-5f3a-infer-infer_m_t0-1", "job_id": "4242"}
{"ts": 1795925149.313, "state": "submitting", "name": "orc-5f3a-infer-infer_m_t1-1", "task_id": "infer_m_t1", \
"stage": "infer", "attempt": 1, "digest": "0d2b7a4f6e139c1e", "submitted_as": "orc-5f3a-infer-1a2b3c4d"}
{"ts": 1795925149.314, "state": "submitting", "name": "orc-5f3a-eval-eval_m_t0-2", "task_id": "eval_m_t0", \
"stage": "eval", "attempt": 2, "digest": "7a4f6e139c1e0d2b"}
{"ts": 1795925149.317, "state": "submitted", "name": "orc-5f3a-eval-eval_m_t0-2", "job_id": "4250"}
{"ts": 1795925149.321, "state": "stop_sent", "name": "orc-5f3a-eval-eval_m_t0-2", "job_id": "4250", \
"reason": "cancelled"}
{"ts": 1795925149.322, "state": "stop_acknowledged", "name": "orc-5f3a-eval-eval_m_t0-2", "job_id": "4250", \
"slurm_state": "COMPLETING"}
{"ts": 1795925149.325, "state": "submit_unknown", "name": "orc-5f3a-infer-infer_m_t1-1", "job_id": ""}
"""


def test_a_ledger_written_before_the_journal_is_read_the_same(tmp_path: Path) -> None:
    """``-r`` of a run folder that an earlier version wrote: its words and fields fold as they did."""
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.jsonl").write_text(OLD_LEDGER)
    ledger = Ledger(str(tmp_path / "slurm"))
    jobs = ledger.jobs()
    t1 = jobs["orc-5f3a-infer-infer_m_t1-1"]
    assert (t1.state, t1.job_id, t1.submitted_as, t1.task_id) == ("submit_unknown", "", "orc-5f3a-infer-1a2b3c4d",
                                                                  "infer_m_t1")
    ev = jobs["orc-5f3a-eval-eval_m_t0-2"]
    assert (ev.state, ev.job_id, ev.attempt, ev.digest, ev.ts) == ("stop_acknowledged", "4250", 2,
                                                                   "7a4f6e139c1e0d2b", 1795925149.322)
    interrupted, known = ledger.left_behind("infer")
    assert interrupted == [] and [(r.name, r.job_id, r.state) for r in known] == [
        ("orc-5f3a-infer-infer_m_t0-1", "4242", "submitted")]
    assert [r.name for r in ledger.left_behind("eval")[1]] == ["orc-5f3a-eval-eval_m_t0-2"]  # still maybe alive
    ledger.record("ended", "orc-5f3a-infer-infer_m_t0-1", job_id="4242", slurm_state="COMPLETED")
    assert ledger.jobs()["orc-5f3a-infer-infer_m_t0-1"].state == "ended"
