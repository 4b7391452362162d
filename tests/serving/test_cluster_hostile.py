"""Managed replicas on a cluster against a hostile neighbour (another user of this machine and of
the Slurm cluster) and a skewed clock: a forged ledger line never cancels someone else's job, files
in the run folder that are not this user's are not believed (status, spec, heartbeat), and the
heartbeat's freshness does not depend on the node's clock agreeing with the file's time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestra.serving import agent
from orchestra.serving.agent import spec_json
from orchestra.serving.pool import reap
from orchestra.serving.slurm_place import SlurmReplica, job_state
from orchestra.serving.spec import ServerSpec
from tests.runners.slurm.conftest import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture

NOBODY = 65534  # a user other than this one (the tests run as root: the Slurm tests need it)


def _forged(path: Path, data: dict[str, object]) -> None:
    """``data`` as a JSON file that another user wrote."""
    path.write_text(json.dumps(data))
    os.chown(path, NOBODY, NOBODY)


@pytest.mark.slurm
def test_reap_never_cancels_another_users_job_named_like_a_replica(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    name = f"orc-serve-{tmp_path.name[-8:]}-m-0"
    # another user: daemon, not nobody (the rootless sandbox tests, running beside this one on another
    # xdist worker, assert that no process of nobody lives on the machine; a job of nobody failed one once)
    out = subprocess.run(["sbatch", "--parsable", "--uid=daemon", "--gid=daemon", f"--job-name={name}",
                          "--output=/dev/null", "--wrap", "sleep 60"], capture_output=True, text=True, check=True)
    job = out.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 20
        while (job_state(job) or ("", "", ""))[2] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        servers = tmp_path / "servers"
        servers.mkdir()
        forged = {"ts": 1.0, "state": "started", "name": "m/0", "slurm_job": job, "job_name": name}
        (servers / "ledger.jsonl").write_text(json.dumps(forged) + "\n")
        reap(str(servers))
        time.sleep(1.0)
        found = job_state(job)
        assert found is not None and found[1] == "daemon" and found[2] == "RUNNING", found
    finally:
        subprocess.run(["scancel", job], check=False)


@pytest.mark.slurm
def test_a_ledger_line_without_a_replica_job_name_cancels_nothing(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    out = subprocess.run(["sbatch", "--parsable", "--job-name=not-a-replica", "--output=/dev/null",
                          "--wrap", "sleep 60"], capture_output=True, text=True, check=True)
    job = out.stdout.strip().split(";")[0]
    try:
        servers = tmp_path / "servers"
        servers.mkdir()
        forged = {"ts": 1.0, "state": "started", "name": "m/0", "slurm_job": job, "job_name": ""}
        (servers / "ledger.jsonl").write_text(json.dumps(forged) + "\n")
        reap(str(servers))
        time.sleep(1.0)
        found = job_state(job)
        assert found is not None and found[2] in ("PENDING", "RUNNING"), found
    finally:
        subprocess.run(["scancel", job], check=False)


def test_a_status_file_of_another_user_is_not_believed(tmp_path: Path) -> None:
    replica = SlurmReplica(ServerSpec("command", "m"), "m", 0, str(tmp_path / "replica-0.log"), job="42")
    ready = {"state": "ready", "host": "127.0.0.1", "port": 9, "url": "http://127.0.0.1:9/v1", "job": "42"}
    _forged(tmp_path / "replica-0.status.json", ready)
    assert replica._read_status() == {}
    os.chown(tmp_path / "replica-0.status.json", os.geteuid(), os.getegid())
    assert replica._read_status()["port"] == 9  # the same file, ours: believed
    os.unlink(tmp_path / "replica-0.status.json")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "replica-0.status.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(ready))
    assert replica._read_status() == {}  # a link is never followed


def test_the_agent_refuses_a_spec_file_of_another_user(tmp_path: Path) -> None:
    spec = tmp_path / "replica-0.spec.json"
    _forged(spec, spec_json(ServerSpec("command", "m", command=("sh", "-c", f"touch {tmp_path}/owned"),
                                            startup_timeout_s=3.0)))
    key = tmp_path / "k.key"
    key.write_text("k")
    (tmp_path / "heartbeat").write_text("1\n")
    res = subprocess.run([sys.executable, "-m", "orchestra.serving.agent", "--spec", str(spec), "--name", "m",
                          "--index", "0", "--log", str(tmp_path / "replica-0.log"),
                          "--status", str(tmp_path / "replica-0.status.json"),
                          "--heartbeat", str(tmp_path / "heartbeat"), "--job", "1"],
                         env={**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(key)},
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode != 0
    assert "spec" in res.stderr and "not a regular file of this user" in res.stderr, res.stderr
    assert not (tmp_path / "owned").exists()


def test_the_heartbeat_is_judged_by_its_changes_not_by_the_nodes_clock(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat"
    beat.write_text("1\n")
    hour_behind = time.time() - 3600  # the orchestrator's clock an hour behind the node's
    os.utime(beat, (hour_behind, hour_behind))
    watch = agent.Heartbeat(str(beat), stale_s=1.0)
    assert watch.fresh()  # first seen: fresh for stale_s
    for i in range(3):  # touched (an hour behind) every 0.5 s: fresh all along
        time.sleep(0.5)
        os.utime(beat, (hour_behind + i + 1, hour_behind + i + 1))
        assert watch.fresh()
    ahead = time.time() + 3600  # then an hour ahead, and never touched again: stale after stale_s
    os.utime(beat, (ahead, ahead))
    assert watch.fresh()
    time.sleep(1.3)
    assert not watch.fresh()


def test_a_heartbeat_of_another_user_is_never_fresh(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat"
    beat.write_text("1\n")
    os.chown(beat, NOBODY, NOBODY)
    assert not agent.Heartbeat(str(beat), stale_s=30.0).fresh()


def _planted(tmp_path: Path, name: str) -> Path:
    """A symbolic link ``name`` in the run folder to a file of ours that must not change."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / name)
    return victim


def test_the_spec_is_written_over_a_planted_link_never_through_it(tmp_path: Path) -> None:
    victim = _planted(tmp_path, "replica-0.spec.json")
    agent.write_spec(str(tmp_path / "replica-0.spec.json"), ServerSpec("command", "m"))
    assert victim.read_text() == "precious\n"
    assert agent.read_own_json(str(tmp_path / "replica-0.spec.json"))["model"] == "m"


def test_the_heartbeat_is_touched_over_a_planted_link_or_file_never_through_it(tmp_path: Path) -> None:
    victim = _planted(tmp_path, "heartbeat")
    beat = str(tmp_path / "heartbeat")
    watch = agent.Heartbeat(beat, stale_s=30.0)
    agent.touch_heartbeat(beat)
    assert victim.read_text() == "precious\n"
    assert watch.fresh()
    os.unlink(beat)
    _forged(tmp_path / "heartbeat", {})  # another user's file: replaced by ours
    agent.touch_heartbeat(beat)
    assert os.lstat(beat).st_uid == os.geteuid() and watch.fresh()
    before = os.stat(beat).st_mtime_ns
    time.sleep(0.05)
    agent.touch_heartbeat(beat)
    assert os.stat(beat).st_mtime_ns != before


@pytest.mark.slurm
def test_a_run_folder_with_odd_characters_gets_its_replica_log_where_it_says(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    from orchestra.serving.slurm_place import batch_script, output_arg

    # sbatch expands %j, %u... in --output; the shell must take quotes, $(), newlines literally
    for name in ("a%jb %u q'x", "back\\slash %j", 'n\nl $(touch pwned) "`id`"'):
        folder = tmp_path / name
        folder.mkdir()
        log = folder / "replica-0.log"
        script = batch_script(["echo", "served"], str(log))
        out = subprocess.run(["sbatch", "--parsable", output_arg(str(log)), "--open-mode=append"], input=script,
                             capture_output=True, text=True, check=True, cwd=tmp_path)
        job, deadline = out.stdout.strip().split(";")[0], time.monotonic() + 30
        while (job_state(job) or ("", "", "PENDING"))[2] in ("PENDING", "RUNNING", "COMPLETING") and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        assert (job_state(job) or ("", "", ""))[2] == "COMPLETED", job_state(job)
        assert log.read_text() == "served\n", sorted(p.name for p in tmp_path.rglob("*"))
    assert not (tmp_path / "pwned").exists()  # the job ran in tmp_path: a $(...) would have made it there


def test_a_replicas_json_of_another_user_sends_no_key_to_a_node_address(tmp_path: Path) -> None:
    from orchestra.serving.balance import ReplicaSet

    listed = tmp_path / "replicas.json"
    _forged(listed, {"replicas": [{"url": "http://10.1.2.3:8000/v1"}]})  # a node address: not checkable
    assert ReplicaSet(str(listed), remote_ok=True).pick() is None
    os.chown(listed, os.geteuid(), os.getegid())  # the same file written by our pool: used
    target = ReplicaSet(str(listed), remote_ok=True).pick()
    assert target is not None and target.url == "http://10.1.2.3:8000/v1"


FAKE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization")
        print("AUTH", auth, flush=True)
        self.send_response(200 if auth else 401)
        self.end_headers()
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print("PORT", srv.server_address[1], flush=True)
srv.serve_forever()
"""


def test_a_loopback_replica_address_held_by_another_user_never_gets_the_key(tmp_path: Path) -> None:
    """The agent checked the port; if another user holds it when the orchestrator asks (the replica
    gone, the port taken), the orchestrator's own check must not send it the key."""
    fake = subprocess.Popen(["/usr/bin/python3", "-c", FAKE], stdout=subprocess.PIPE, text=True,
                            user=NOBODY, group=NOBODY, cwd="/")
    try:
        assert fake.stdout is not None
        port = int(fake.stdout.readline().split()[1])
        replica = SlurmReplica(ServerSpec("command", "m"), "m", 0, str(tmp_path / "replica-0.log"), job="42")
        replica.started = replica.looked = time.monotonic()  # squeue is not asked about job 42 for 1 s
        (tmp_path / "replica-0.status.json").write_text(json.dumps(
            {"state": "ready", "host": "127.0.0.1", "port": port, "url": f"http://127.0.0.1:{port}/v1",
             "job": "42"}))
        assert replica.check("the-key") == "foreign"
    finally:
        fake.kill()
    out = fake.communicate(timeout=10)[0]
    assert "the-key" not in out, out


@pytest.mark.slurm
def test_reap_deletes_the_private_files_a_killed_orchestrators_replica_jobs_left(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """A replica job's secret-looking variables wait in servers/<model>/private/replica-<i>.env until
    the replica stops; after a SIGKILL the -r's reap cancels the job and (before: not) the file goes too."""
    servers = tmp_path / "servers"
    private = servers / "m" / "private"
    private.mkdir(parents=True, mode=0o700)
    left = private / "replica-0.env"
    left.write_text("export HF_TOKEN=hf_left_behind\n")
    record = {"ts": 1.0, "state": "started", "name": "m/0", "slurm_job": "999999999",
              "job_name": f"orc-serve-{tmp_path.name[-8:]}-m-0", "log": str(servers / "m" / "replica-0.log")}
    (servers / "ledger.jsonl").write_text(json.dumps(record) + "\n")
    reap(str(servers))
    assert not left.exists()
