"""Secrets for DLC containers: passed by name (``forward_env``), never in argv, the run folder or logs;
``extra_envs`` refuses them in clear."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from dlc_helpers import Double, aliyun_cfg, dlc_runner, env_with_double, run_dirs, write_config

REPO = Path(__file__).resolve().parents[3]
SECRET = "hf_s3cr3t-VALUE-4f1c9a"  # what a token looks like; it must appear nowhere but the container


def run_with(state: Path, env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**env_with_double(state), **env})


def test_forward_env_reaches_the_container_and_nothing_else(double: Double, tmp_path: Path) -> None:
    """HF_TOKEN set in the orchestrator's environment and named in forward_env: every container has
    it (a hash of what it saw is written outside the run), and its value is in no dlc argv, no file of
    the run folder (config.py, task logs, events, ledger), and not in what the CLI printed."""
    seen = tmp_path / "seen"
    # Inside the container: the hash of what $HF_TOKEN holds there, then the task.
    template = ["bash", "-c", 'printf %s "$HF_TOKEN" | sha256sum >> "$0"; exec "$@"', str(seen), "{task_cmd}"]
    cfg = write_config(tmp_path, dlc_runner(tmp_path, template=template, forward_env=["HF_TOKEN"]), tasks=2)
    res = run_with(double.state, {"HF_TOKEN": SECRET}, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    want = hashlib.sha256(SECRET.encode()).hexdigest()
    hashes = [line.split()[0] for line in seen.read_text().splitlines()]
    assert len(hashes) == 3 and set(hashes) == {want}  # 2 infer + 1 eval containers, each had the token
    assert SECRET not in res.stdout + res.stderr
    calls = double.calls("submit")
    assert len(calls) == 3 and all(SECRET not in json.dumps(c["argv"]) for c in calls)
    assert SECRET not in (double.state / "calls.jsonl").read_text()
    (run,) = run_dirs(tmp_path / "out")
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".log") for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert not list((run / "dlc").rglob("*.env")), "the forwarded variables' file is deleted at the end"
    assert "forward_env" in (run / "config.py").read_text()


def test_env_file_is_private_and_sourced_by_path(tmp_path: Path) -> None:
    """The file the container sources: 0600 in a 0700 folder, written whole; the command names its
    path, never the value."""
    from orchestra.envfile import remove_env_file, write_env_file
    from orchestra.runners.dlc.config import AliyunConfig, container_command
    from orchestra.runners.dlc.runner import env_file_path

    os.umask(0o022)
    path = env_file_path(str(tmp_path / "dlc"), "infer")
    write_env_file(path, ["HF_TOKEN", "NOT_SET_HERE"], {"HF_TOKEN": "it's $secret"})
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    cfg = AliyunConfig.create(aliyun_cfg(tmp_path))
    command = container_command(cfg, ["python", "-c", "pass"], {}, "/", "/x/exit", "job", path)
    assert "it's" not in command and path in command
    check = f'. {path}; printf %s "$HF_TOKEN"; printf %s "${{NOT_SET_HERE-unset}}"'
    out = subprocess.run(["bash", "-c", check], capture_output=True, text=True, check=True)
    assert out.stdout == "it's $secretunset"
    remove_env_file(path)
    assert not os.path.exists(path)


def test_secret_in_extra_envs_is_refused(double: Double, tmp_path: Path) -> None:
    """extra_envs=['HF_TOKEN=...'] is a config error (exit 2): one line naming the variable and how to
    pass it, never the value; nothing is submitted and no run folder is made."""
    (tmp_path / "aliyun.json").write_text(json.dumps(aliyun_cfg(tmp_path, extra_envs=[f"HF_TOKEN={SECRET}"])))
    cfg = write_config(tmp_path, dlc_runner(tmp_path))
    res = run_with(double.state, {}, cfg)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "HF_TOKEN" in lines[0] and "forward_env" in lines[0], res.stderr
    assert SECRET not in res.stdout + res.stderr
    assert not double.calls("submit") and not run_dirs(tmp_path / "out")


def test_secret_looking_names() -> None:
    from orchestra.secretnames import secret_assignment as secret_looking

    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "APIKEY",
                 "HUGGING_FACE_HUB_TOKEN", "GOOGLE_CREDENTIALS", "hf_token"):
        assert secret_looking(name, "x"), name
    for name in ("ORC_TEST_ENV", "KEYBOARD", "TOKENIZERS_PARALLELISM", "HF_HOME"):
        assert not secret_looking(name, "x"), name
    assert not secret_looking("HF_TOKEN", "$HF_TOKEN_IN_IMAGE")  # a reference to the container's own


def test_forward_env_of_an_unset_variable_is_a_config_error(double: Double, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path, forward_env=["ORC_SURELY_UNSET_VAR"]))
    env = {k: v for k, v in env_with_double(double.state).items() if k != "ORC_SURELY_UNSET_VAR"}
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 2 and "ORC_SURELY_UNSET_VAR" in res.stderr and "not set" in res.stderr, res.stderr
