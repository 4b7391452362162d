"""Helpers of the security tests: a second, hostile local user, a shared sticky temporary
folder as /tmp is, and the CLI run on a tiny config with an API model."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "orchestra-hostile"


def hostile_ids() -> tuple[int, int]:
    """uid and gid of the hostile user, created (a system user without a home) if missing."""
    if os.geteuid() != 0:
        pytest.fail("the shared-folder tests need root (they create and act as a second user); CI runs them as root")
    try:
        pw = pwd.getpwnam(HOSTILE)
    except KeyError:
        subprocess.run(["useradd", "-r", "-M", "-s", "/usr/sbin/nologin", HOSTILE], check=True,
                       capture_output=True, text=True)
        pw = pwd.getpwnam(HOSTILE)
    return pw.pw_uid, pw.pw_gid


def as_hostile(*argv: str) -> None:
    """Run ``argv`` as the hostile user (its own uid and gid, no supplementary groups)."""
    uid, gid = hostile_ids()
    subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv],
                   check=True, capture_output=True, text=True, timeout=30)


def shared_tmp_folder() -> Iterator[Path]:
    """A folder every user may create entries in, sticky as /tmp is (tmp_path's parents are
    private to root, so the hostile user could not reach a folder under it)."""
    folder = Path(tempfile.mkdtemp(prefix="orchestra-sec-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_config(folder: Path, base_url: str, data: Path, *, max_out_len: int = 16) -> Path:
    """A config with one API model at ``base_url`` and one gen dataset read from ``data``."""
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={base_url!r}, max_connections=4,
               max_retries=2, max_out_len={max_out_len})]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len={max_out_len})),
                 eval_cfg=dict(evaluator=dict(type='numeric_match')))]
infer = dict(partitioner=dict(type=NaivePartitioner),
             runner=dict(type=LocalRunner, max_num_workers=1, retry=0, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers=1, retry=0, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def cli_env(folder: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI run: its own cache; host slots in the default place (no
    ``ORCHESTRA_LOCK_DIR``) unless ``extra`` sets one."""
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHESTRA_LOCK_DIR", "ORCHESTRA_SANDBOX_DIR")}
    env["ORCHESTRA_CACHE_DIR"] = str(folder / "cache")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def run_cli(cfg: Path, env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run.py", str(cfg), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def the_run(folder: Path) -> Path:
    """The one run folder a CLI run made under ``folder/out``."""
    (run,) = [p for p in (folder / "out").iterdir() if p.is_dir()]
    return run
