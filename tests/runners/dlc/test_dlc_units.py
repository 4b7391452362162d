"""DLCRunner's pieces without a launch: the CLI contract's parsing, aliyun_cfg, the container command."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from dlc_helpers import aliyun_cfg

from orchestra.registry import RUNNERS
from orchestra.runners import DLCRunner
from orchestra.runners.core.ledger import Ledger
from orchestra.runners.core.shell import shell_value
from orchestra.runners.dlc.cli import format_time, parse_job_id, parse_job_info, parse_time
from orchestra.runners.dlc.config import (
    AliyunConfig,
    container_command,
    load_aliyun_file,
    submit_argv,
)
from orchestra.runners.dlc.runner import dlc_job_name
from orchestra.tasks.spec import TaskSpec

BASE = {"workspace_id": "ws", "resource_id": "q", "worker_image": "img"}


def task(run_dir: str = "/runs/r1", task_id: str = "infer_m_d", num_gpus: int = 0) -> TaskSpec:
    return TaskSpec(stage="infer", task_id=task_id, run_dir=run_dir, model={}, model_abbr="m", units=(),
                    num_gpus=num_gpus)


# -- the CLI's answers ------------------------------------------------------------------------------
@pytest.mark.parametrize("output", [
    "+------------------+------+\n| JobId | Name |\n+---+\n| dlc0123456789abc | orc-x |\n+---+\n",
    "Job created. JobId: dlc0123456789abc\n",
    "[OK] submitted job dlc0123456789abc (orc-dlc-name)\n",
    "dlc0123456789abc",
])
def test_the_job_id_is_matched_not_the_layout(output: str) -> None:
    assert parse_job_id(output) == "dlc0123456789abc"


@pytest.mark.parametrize("output", [
    "", "<html>502 Bad Gateway</html>", "[FAILED] code: 500, InternalError",
    "| dlc0123456789abc | dlc0123456789xyz |",  # two ids: which one is ours is unknown
    "| dlc0123456789ab |", "| dlc0123456789abcd |", "| xdlc0123456789abc |",  # not 13 characters / not a word
    "| dlc0123456789ABC |",  # upper case is not a DLC id
])
def test_no_or_ambiguous_job_id(output: str) -> None:
    assert parse_job_id(output) is None


def test_job_info_after_a_status_line_and_brace_noise() -> None:
    doc = {"JobId": "dlc0123456789abc", "Status": "Failed", "ReasonCode": "NodeLost", "ReasonMessage": "gone",
           "GmtCreateTime": "2024-01-02T03:04:05Z", "GmtFinishTime": "2024-01-02T03:14:05Z",
           "Pods": [{"PodId": "dlc0123456789abc-worker-0"}, {"PodId": "dlc0123456789abc-master-0"}]}
    info = parse_job_info("[OK] {noise}\n" + json.dumps(doc, indent=2), "dlc0123456789abc")
    assert (info.status, info.reason_code, info.pod_id) == ("Failed", "NodeLost", "dlc0123456789abc-master-0")
    assert info.finish_time - info.create_time == 600 and info.terminal
    assert info.describe() == "Failed (NodeLost: gone)"
    bare = parse_job_info('{"Status": "Queuing"}', "dlc0123456789abc")
    assert bare.pod_id == "dlc0123456789abc-master-0" and not bare.terminal and bare.create_time is None


@pytest.mark.parametrize("output", ["", "[OK]", "upstream connect error", '{"JobId": "x"}', "[1, 2]", "{broken"])
def test_job_info_without_a_status_is_an_error(output: str) -> None:
    with pytest.raises(ValueError):
        parse_job_info(output, "dlc0123456789abc")


def test_times() -> None:
    t = parse_time("2020-11-08T16:00:00Z")
    assert format_time(int(t)) == "2020-11-08T16:00:00Z"
    assert parse_time("2020-11-09T00:00:00+08:00") == t
    assert parse_time("2020-11-08T16:00:00.5Z") == t + 0.5
    assert parse_time("yesterday") is None and parse_time(None) is None
    assert parse_time("2020-13-45T00:00:00Z") is None  # looks like one, is not


# -- aliyun_cfg ---------------------------------------------------------------------------------------
def test_unknown_key_is_one_line_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        AliyunConfig.create({**BASE, "workspaceid": "x"})
    message = str(err.value)
    assert "\n" not in message and "'workspaceid'" in message
    assert "valid keys: workspace_id, resource_id, worker_image, dlc_config_path" in message


@pytest.mark.parametrize("bad, words", [
    ({"resource_id": None}, "missing required key 'resource_id'"),
    ({"priority": "high"}, "aliyun_cfg.priority: expected an integer"),
    ({"worker_memory": 0}, "aliyun_cfg.worker_memory"),
    ({"bashrc_path": "/home/u/.bashrc"}, "bashrc_path and conda_env_name go together"),
    ({"extra_envs": "A=1"}, "aliyun_cfg.extra_envs: expected a list"),
    ({"extra_envs": ["1A=x"]}, "is not 'NAME=value'"),
    ({"dlc_job_cmd": "run"}, "aliyun_cfg.dlc_job_cmd"),
    ({"hf_offline": "yes"}, "aliyun_cfg.hf_offline: expected True or False"),
    ({"data_sources": [1]}, "aliyun_cfg.data_sources"),
    ({"worker_image": ""}, "missing required key 'worker_image'"),
    ({"pre_cmd": "  "}, "aliyun_cfg.pre_cmd: expected a non-empty string, got '  '"),
    ({"priority": None}, "aliyun_cfg.priority: expected an integer >= 1, got None"),
    ({"preemptible": 1}, "aliyun_cfg.preemptible: expected True or False, got 1"),
    ({"dlc_sleep_time": 0}, "aliyun_cfg.dlc_sleep_time: expected seconds > 0, got 0"),
    ({"dlc_sleep_time": True}, "aliyun_cfg.dlc_sleep_time: expected seconds > 0, got True"),
    ({"umask": "0999"}, "aliyun_cfg.umask: expected an octal mask such as '0022', got '0999'"),
    ({"dlc_job_cmd": None}, "aliyun_cfg.dlc_job_cmd: expected 'submit'"),
])
def test_bad_values_name_the_key(bad: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        AliyunConfig.create({**BASE, **bad})


def test_opencompass_keys_are_accepted() -> None:
    cfg = AliyunConfig.create({**BASE, "bashrc_path": "/u/.bashrc", "conda_env_name": "oc", "dlc_config_path": "~/.dlc",
                               "data_sources": "d-1, d-2", "priority": 3, "hf_offline": False,
                               "huggingface_cache": "/hf", "torch_cache": "/t", "http_proxy": "http://p:3128",
                               "hf_endpoint": "https://mirror", "extra_envs": ["A=1"], "worker_cpu": 4,
                               "worker_memory": 64, "dlc_job_cmd": "create", "preemptible": True,
                               "pre_cmd": "nvidia-smi", "dlc_sleep_time": 5, "workspace_id": 123})
    assert cfg.data_sources == ("d-1", "d-2") and cfg.workspace_id == "123"
    assert cfg.worker_resources(0) == (0, 4, 64)
    runner = DLCRunner({**BASE, "dlc_sleep_time": 5})
    assert runner.timings.poll_interval_s == 5  # OpenCompass's poll interval, unless poll_interval_s is given


def test_resources_scale_with_gpus() -> None:
    cfg = AliyunConfig.create(BASE)
    assert cfg.worker_resources(0) == (0, 12, 192)
    assert cfg.worker_resources(2) == (2, 16, 256)
    assert cfg.worker_resources(8) == (8, 64, 1024)


def test_submit_argv_both_client_generations() -> None:
    cfg = AliyunConfig.create({**BASE, "dlc_config_path": "/c/dlc.ini", "data_sources": ["a", "b"]})
    argv = submit_argv("dlc", cfg, "orc-x", "echo hi", 1)
    assert argv[:3] == ["dlc", "submit", "pytorchjob"] and "--kind" not in argv
    assert argv[argv.index("--command") + 1] == "echo hi" and argv[argv.index("--name") + 1] == "orc-x"
    assert argv[argv.index("--workers") + 1] == "1" and "--worker_count" not in argv
    assert ["--worker_cpu", "12", "--worker_gpu", "1", "--worker_memory", "192Gi"] == argv[
        argv.index("--worker_cpu"):argv.index("--worker_memory") + 2]
    assert "--resource_id=q" in argv and "--data_sources=a,b" in argv and "--config" in argv
    old = submit_argv("dlc", AliyunConfig.create({**BASE, "dlc_job_cmd": "create", "preemptible": False}),
                      "orc-x", "echo", 0)
    assert old[:5] == ["dlc", "create", "job", "--kind", "PyTorchJob"] and "--workers" not in old
    assert old[old.index("--worker_count") + 1] == "1" and "--enable_priority_preemption=false" in old


def test_job_names_are_unique_and_at_most_512() -> None:
    assert dlc_job_name(task(), 2).endswith("-infer_m_d-a2") and dlc_job_name(task(), 2).startswith("orc-")
    a, b = dlc_job_name(task(task_id="x" * 600 + "a"), 1), dlc_job_name(task(task_id="x" * 600 + "b"), 1)
    assert len(a) == len(b) == 512 and a != b and a.endswith("-a1")


def test_load_aliyun_file_reads_values_never_code(tmp_path: Path) -> None:
    py = tmp_path / ".aliyun.cfg"
    py.write_text("'''doc'''\nworkspace_id = '1'\npriority = 2\nextra = dict(a=[1, 2])\n_private = 1\n")
    assert load_aliyun_file(str(py)) == {"workspace_id": "1", "priority": 2, "extra": {"a": [1, 2]}}
    js = tmp_path / "a.json"
    js.write_text('{"workspace_id": "1"}')
    assert load_aliyun_file(str(js)) == {"workspace_id": "1"}
    ym = tmp_path / "a.yaml"
    ym.write_text("workspace_id: '1'\n")
    assert load_aliyun_file(str(ym)) == {"workspace_id": "1"}
    evil = tmp_path / "evil.cfg"
    evil.write_text("import os\nx = os.system('touch /tmp/pwned')\n")
    with pytest.raises(ValueError, match=r"evil.cfg:1: only 'key = value' lines"):
        load_aliyun_file(str(evil))
    evil.write_text("x = __import__('os').system('true')\n")
    with pytest.raises(ValueError, match="not a plain value"):
        load_aliyun_file(str(evil))
    with pytest.raises(ValueError, match="cannot read"):
        load_aliyun_file(str(tmp_path / "missing.cfg"))


# -- the container command ----------------------------------------------------------------------------
def test_shell_value_quotes_but_keeps_variable_references() -> None:
    value = shell_value('/a b/$HOME:${HOME}/"q"; $(echo no)')
    out = subprocess.run(["bash", "-c", f'X={value}; printf %s "$X"'],
                         env={"HOME": "/h", "PATH": os.environ["PATH"]}, capture_output=True, text=True).stdout
    assert out == '/a b//h:/h/"q"; $(echo no)'
    assert shell_value("") == "''"


def test_container_command_runs_in_a_bare_shell_with_hostile_paths(tmp_path: Path) -> None:
    """Everything the task needs is in the command: a bare environment, cwd '/', paths with spaces,
    quotes, $ and ; stay what they are, the exit code is recorded and returned."""
    weird = tmp_path / "it's a $dir; ok"
    env_root = weird / "py env"
    (env_root / "bin").mkdir(parents=True)
    fake_python = env_root / "bin" / "python"
    fake_python.write_text('#!/bin/bash\nprintf "ARG=%s\\n" "$@"\nprintf "ENV %s=%s\\n" ORC_X "$ORC_X" '
                           'ORCHESTRA_TASK_ID "$ORCHESTRA_TASK_ID" HF_HUB_OFFLINE "$HF_HUB_OFFLINE" '
                           'WHERE "$(pwd)" PATHY "$ORC_PATH"\nexit 7\n')
    fake_python.chmod(0o755)
    cfg = AliyunConfig.create({**BASE, "python_env_path": str(env_root),
                               "extra_envs": ["ORC_X=a 'b' \"c\"; d", "ORC_PATH=/x:$PATH"]})
    exit_file = str(weird / "run" / "dlc" / "exit" / "orc-job")
    spec = str(weird / "tasks" / "t 1.py")
    command = container_command(cfg, [cfg.python(), "-m", "orchestra.tasks.infer", spec],
                                {"ORCHESTRA_TASK_ID": "t'1"}, str(weird), exit_file, "orc-job")
    res = subprocess.run(["bash", "-c", command], env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True,
                         text=True)
    assert res.returncode == 7, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("===== dlc: job orc-job on ")
    assert ["ARG=-m", "ARG=orchestra.tasks.infer", f"ARG={spec}"] == lines[1:4]
    assert "ENV ORC_X=a 'b' \"c\"; d" in lines and "ENV ORCHESTRA_TASK_ID=t'1" in lines
    assert "ENV HF_HUB_OFFLINE=1" in lines and f"ENV WHERE={weird}" in lines
    assert f"ENV PATHY=/x:{env_root}/bin:/usr/bin:/bin" in lines
    assert lines[-1] == "===== orchestra: task exited with code 7"
    assert Path(exit_file).read_text() == "7\n"


def test_conda_setup_comes_first_and_pre_cmd_before_it() -> None:
    cfg = AliyunConfig.create({**BASE, "bashrc_path": "/home/u s/.bashrc", "conda_env_name": "oc env",
                               "pre_cmd": "echo pre"})
    command = container_command(cfg, ["python", "-m", "x"], {}, "/w", "/r/dlc/exit/n", "n")
    assert command.startswith("echo pre; . '/home/u s/.bashrc'; conda activate 'oc env'; ")
    assert "\n" not in command and cfg.python() == "python"
    background = AliyunConfig.create({**BASE, "pre_cmd": "sleep 1 &"})
    assert container_command(background, ["true"], {}, "/w", "/r/n", "n").startswith("sleep 1 & export ")


def test_cache_proxy_and_endpoint_keys_become_the_containers_variables() -> None:
    cfg = AliyunConfig.create({**BASE, "hf_offline": False, "huggingface_cache": "/hf c", "torch_cache": "/t",
                               "http_proxy": "http://p:3128", "hf_endpoint": "https://mirror", "umask": 22})
    command = container_command(cfg, ["true"], {}, "/w", "/r/n", "n")
    for name, value in [("HF_HUB_CACHE", "'/hf c'"), ("HUGGINGFACE_HUB_CACHE", "'/hf c'"), ("TORCH_HOME", "/t"),
                        *[(k, "http://p:3128") for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")],
                        ("HF_ENDPOINT", "https://mirror")]:
        assert f"; export {name}={value}; " in f"; {command}"
    assert "OFFLINE" not in command and "; umask 22; " in command
    plain = container_command(AliyunConfig.create(BASE), ["true"], {}, "/w", "/r/n", "n")
    assert "export HF_HUB_OFFLINE=1; " in plain and "; umask 0000; " in plain
    assert not any(k in plain for k in ("HF_HUB_CACHE", "TORCH_HOME", "proxy", "PROXY", "HF_ENDPOINT"))


# -- the runner's surface -------------------------------------------------------------------------------
def test_registered_and_exported() -> None:
    assert RUNNERS.resolve("DLCRunner", "x") is DLCRunner


def test_runner_options_are_checked() -> None:
    for bad in (dict(poll_interval_s=0), dict(queue_timeout_s=-1), dict(cli_concurrency=0), dict(infra_retry=-1),
                dict(log_settle_s=-1), dict(max_calls_per_s=0)):
        with pytest.raises(ValueError):
            DLCRunner(BASE, **bad)
    with pytest.raises(ValueError, match="aliyun_cfg must be a dict"):
        DLCRunner(["x"])  # type: ignore[arg-type]


def test_a_dlc_config_path_missing_here_makes_the_runner_unfit(tmp_path: Path) -> None:
    runner = DLCRunner({**aliyun_cfg(tmp_path), "dlc_config_path": str(tmp_path / "none.ini")},
                       dlc_bin="/bin/true")
    assert runner._check_tools() == f"aliyun_cfg.dlc_config_path {str(tmp_path / 'none.ini')!r} does not exist " \
        "on this machine"
    assert DLCRunner(aliyun_cfg(tmp_path), dlc_bin="/bin/true")._check_tools() is None


def test_get_command_is_the_submit_argv(tmp_path: Path) -> None:
    runner = DLCRunner(aliyun_cfg(tmp_path), template="nice -n 5 {task_cmd}")
    cmd = runner.get_command(task(str(tmp_path / "run"), num_gpus=1), "/s p/t.py", {}, 3)
    assert cmd.argv[:3] == ("dlc", "submit", "pytorchjob") and cmd.env == {}
    inner = cmd.argv[cmd.argv.index("--command") + 1]
    assert "nice -n 5 " in inner and "-m orchestra.tasks.infer '/s p/t.py'" in inner
    assert "export ORCHESTRA_ATTEMPT=3" in inner and cmd.argv[cmd.argv.index("--worker_gpu") + 1] == "1"
    assert f"{tmp_path}/run/dlc/exit/orc-" in inner


def test_ledger_folds_states(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    ledger.record("submitting", "a", task_id="t", attempt=1, digest="d1")
    ledger.record("submitted", "a", job_id="dlc0123456789abc")
    ledger.record("stop_sent", "a", reason="x")
    ledger.record("submitting", "b", task_id="u", attempt=2)
    with open(ledger.path, "a") as f:
        f.write('{"torn": ')  # a crash mid-line
    jobs = ledger.jobs()
    assert (jobs["a"].state, jobs["a"].job_id, jobs["a"].digest, jobs["a"].attempt) == \
        ("stop_sent", "dlc0123456789abc", "d1", 1)
    assert (jobs["b"].state, jobs["b"].attempt) == ("submitting", 2)


class _GrowingLog:
    """A log service whose lines become readable in the order they were written: before its
    n-th call, ``schedule[n]`` of them (the last number holds from then on)."""

    def __init__(self, times: list[float], schedule: list[int]) -> None:
        self.times, self.schedule, self.calls = times, schedule, 0

    def logs(self, job_id: str, pod_id: str, start_s: int, end_s: int, max_events: int) -> list[str]:
        visible = self.schedule[min(self.calls, len(self.schedule) - 1)]
        self.calls += 1
        out = [f"l{i}" for i, t in enumerate(self.times[:visible]) if start_s <= t < end_s]
        return out[:max_events]


def test_a_split_window_read_while_lines_arrive_is_a_prefix_of_the_log() -> None:
    """Regression: a window split in halves was read earlier half first, so lines arriving
    between the two reads could leave a hole (the task's last lines lost, the footer kept)."""
    from orchestra.runners.dlc.logs import read_window

    times = [10.1, 10.2, 10.3, 11.5, 12.2, 13.9, 13.95]  # a burst, then lines in later seconds
    for jump_after in range(1, 8):  # the rest of the lines arrive after that many calls
        service = _GrowingLog(times, [3] * jump_after + [len(times)])
        got = read_window(service, "j", "p", 10, 14, max_events=2)  # type: ignore[arg-type]
        assert service.calls > 1  # the window was split
        assert got == [f"l{i}" for i in range(len(got))], (jump_after, got)  # no hole before the last line


class _FullLog:
    """A log service that always answers with as many lines as it was asked for."""

    def logs(self, job_id: str, pod_id: str, start_s: int, end_s: int, max_events: int) -> list[str]:
        return [f"l{i}" for i in range(max_events)]


def test_a_second_over_the_cap_is_read_with_a_larger_one_and_says_lines_are_missing() -> None:
    from orchestra.runners.dlc.logs import read_window

    got = read_window(_FullLog(), "j", "p", 10, 11, max_events=5)  # type: ignore[arg-type]
    assert got[:-1] == [f"l{i}" for i in range(100_000)]
    assert got[-1] == "===== orchestra: more than 100000 lines in one second of the DLC log; some are missing"
    assert read_window(_FullLog(), "j", "p", 11, 11) == []  # type: ignore[arg-type]


def test_how_an_attempt_ended() -> None:
    """The task's recorded code decides; without one, a stop from outside is a failure and anything
    else the platform's (an infrastructure exit, which does not spend ``retry``)."""
    from orchestra.runners.dlc.cli import DLCJobStatus
    from orchestra.runners.dlc.job import attempt_exit

    stopped, lost = DLCJobStatus("dlc1", "Stopped"), DLCJobStatus("dlc1", "Failed", "NodeLost", "gone")
    outside = attempt_exit("dlc1", stopped, None, "")
    assert (outside.code, outside.infra) == (-1, False) and "stopped from outside orchestra" in outside.reason
    platform = attempt_exit("dlc1", lost, None, "l1 | l2")
    assert platform.infra
    assert platform.reason.endswith("Failed (NodeLost: gone) before the task finished; log tail: l1 | l2")
    task = attempt_exit("dlc1", lost, 3, "")
    assert (task.code, task.infra) == (3, False) and task.reason.startswith("exit code 3; ")
    assert attempt_exit("dlc1", stopped, 0, "").code == 0


def test_the_container_imports_this_orchestra_and_the_real_requests(tmp_path: Path) -> None:
    """Regression: the container's PYTHONPATH held the ``orchestra`` folder itself (one level too deep
    since config.py moved into ``runners/dlc/``), so ``orchestra/requests.py`` shadowed the
    ``requests`` library (which Hugging Face imports) in every DLC task."""
    import sys

    import orchestra
    probe = "import orchestra, requests; print(orchestra.__file__); print(requests.__file__)"
    command = container_command(AliyunConfig.create(BASE), [sys.executable, "-c", probe], {}, str(tmp_path),
                                str(tmp_path / "exit"), "n")
    res = subprocess.run(["bash", "-c", command], env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    ours, theirs = res.stdout.splitlines()[1:3]
    assert ours == orchestra.__file__
    assert os.path.dirname(orchestra.__file__) not in theirs and theirs.endswith("requests/__init__.py")


class _SlowLogAfterEnd:
    """A log service whose first read answers ``slow_s`` after it began, with what was readable
    when it began; the job's last line (its exit-code footer) becomes readable just after that."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.began: list[float] = []
        self.created = self.finished = time.time()  # the service's clock is ours

    def get(self, job_id: str) -> object:
        from orchestra.runners.dlc.cli import DLCJobStatus

        return DLCJobStatus(job_id, "Succeeded", create_time=self.created, finish_time=self.finished,
                            pod_id=f"{job_id}-master-0")

    def logs(self, job_id: str, pod_id: str, start_s: int, end_s: int, max_events: int) -> list[str]:
        from orchestra.runners.dlc.config import FOOTER

        self.began.append(time.time())
        lines = ["[task] done"] + ([f"{FOOTER}0"] if len(self.began) > 1 else [])
        if len(self.began) == 1:
            time.sleep(self.slow_s)
        return lines


def test_a_slow_final_read_that_began_before_the_footer_showed_is_followed_by_another(tmp_path: Path) -> None:
    """Regression: the drain of an ended job's log was judged when its read *ended*: a read begun
    before the footer was readable and ending past finish + 2 x settle ended the drain, and the
    task log lost its last lines.  The read that *began* after that time decides now."""
    from orchestra.events import EventLog
    from orchestra.runners.dlc.job import DLCJob, Timings
    from orchestra.runners.dlc.track import Tracker

    settle = 1.0
    service = _SlowLogAfterEnd(slow_s=2 * settle + 0.2)
    tracker = Tracker(service, Ledger(str(tmp_path)), EventLog(str(tmp_path / "events.jsonl")),  # type: ignore[arg-type]
                      Timings(0.1, 1.0, None, settle, 60.0, 5.0))
    exit_file = tmp_path / "exit"
    exit_file.write_text("0\n")
    job = DLCJob("orc-x-t-a1", "t", "infer", 1, "d", str(tmp_path / "task.log"), str(exit_file), [],
                 job_id="dlc1", submitted_wall=service.created)
    service.finished = time.time()  # the job has just ended
    assert tracker.look(job) is None and not job.over  # the first read ended past 2 x settle
    assert service.began[0] < service.finished + 2 * settle < time.time()
    deadline = time.monotonic() + 30
    while True:  # the next looks, each when the tracker asked for it, as a poll round makes them
        time.sleep(max(0.0, job.next_check - time.monotonic()))
        if (ended := tracker.look(job)) is not None:
            break
        assert time.monotonic() < deadline
    assert ended.code == 0 and job.over and len(service.began) == 2
    log = (tmp_path / "task.log").read_text().splitlines()
    assert log[:2] == ["[task] done", "===== orchestra: task exited with code 0"]
    assert log[2].startswith("===== dlc: job dlc1 ended Succeeded, task exit code 0")
