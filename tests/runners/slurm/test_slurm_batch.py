"""The sbatch launcher's pieces without a cluster: sbatch's options and answer, the job script."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestra.cluster.slurm import SbatchError, output_pattern, parse_parsable
from orchestra.runners.base import Job
from orchestra.runners.core.command import Command
from orchestra.runners.slurm.batch import SbatchLauncher
from orchestra.runners.slurm.common import SlurmOptions
from orchestra.runners.slurm.script import job_script
from orchestra.tasks.spec import TaskSpec


def task(task_id: str = "infer_m_a", num_gpus: int = 0) -> TaskSpec:
    return TaskSpec(stage="infer", task_id=task_id, run_dir="/r", model={"abbr": "m"}, model_abbr="m", units=(),
                    num_gpus=num_gpus)


@pytest.mark.parametrize("stdout, answer", [
    ("4242\n", ("4242", None)),
    ("4242;cluster_a\n", ("4242", "cluster_a")),
    ("\n 17 \n", ("17", None)),
    ("a line sbatch's plugins printed\n4242\n", ("4242", None)),  # the id is the last line
])
def test_parsable_output_is_the_job_id_and_maybe_the_cluster(stdout: str, answer: tuple[str, str | None]) -> None:
    assert parse_parsable(stdout) == answer


@pytest.mark.parametrize("stdout", ["", "Submitted batch job 4242\n", "4242;\n", "12a\n", ";cluster\n"])
def test_anything_else_from_sbatch_is_an_error_that_quotes_it(stdout: str) -> None:
    with pytest.raises(SbatchError, match="unexpected sbatch --parsable output"):
        parse_parsable(stdout)


def test_output_pattern_names_the_file_by_job_id_and_escapes_percent() -> None:
    assert output_pattern("/runs/a b", array=True) == "/runs/a b/%A_%a.out"
    assert output_pattern("/runs/a b", array=False) == "/runs/a b/%j.out"
    assert output_pattern("/runs/100%x", array=False) == "/runs/100%%x/%j.out"


def test_sbatch_options_of_an_array_and_of_a_single_job(tmp_path: Path) -> None:
    options = SlurmOptions.create(partition="gpu", qos="high", cpus_per_task=4, mem_gb=1.5, time_limit="1:30:00",
                                  extra_args="--account=proj --constraint a100")
    launcher = SbatchLauncher(options, "12345678", str(tmp_path))
    assert launcher.sbatch_args(task(num_gpus=1), "orc-12345678-infer", 3) == [
        "--parsable", "--job-name=orc-12345678-infer", "--nodes=1", "--open-mode=append",
        f"--output={tmp_path}/%A_%a.out", "--array=0-2", "--partition=gpu", "--qos=high", "--gres=gpu:1",
        "--cpus-per-task=4", "--mem=1536M", "--time=1:30:00", "--account=proj", "--constraint=a100",
    ]
    single = launcher.sbatch_args(task(), "orc-12345678-infer_m_a-a1", 1)
    assert f"--output={tmp_path}/%j.out" in single
    assert not [a for a in single if a.startswith(("--array", "--gres"))]


def test_job_script_runs_its_array_index_with_argv_untouched(tmp_path: Path) -> None:
    hostile = ["sh", "-c", 'printf "%s|" "$@"; echo "$V"', "_", "a b", "'q'", '"d"', "$HOME", "`id`", "; echo no"]
    logs = [tmp_path / "a b'c" / "0.log", tmp_path / "1.log"]
    logs[0].parent.mkdir()
    jobs = [
        Job(task("t0"), 1, Command(("sh", "-c", "echo zero; exit 3"), {}), str(logs[0]), {}),
        Job(task("t1"), 2, Command(tuple(hostile), {"ORCHESTRA_ATTEMPT": "2", "V": "x y;z"}), str(logs[1]), {}),
    ]
    script = tmp_path / "job.sh"
    script.write_text(job_script(jobs, ["--parsable", "--job-name=a b"]))
    assert script.read_text().splitlines()[:2] == [
        "#!/bin/bash", "# submitted by orchestra: sbatch --parsable '--job-name=a b' <this script>"]

    def run(index: str) -> int:
        env = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": index, "PATH": "/usr/bin:/bin",
               "CUDA_VISIBLE_DEVICES": "2"}
        return subprocess.run(["bash", str(script)], env=env, timeout=30, check=False).returncode

    assert run("1") == 0
    header, output, footer = logs[1].read_text().splitlines()
    assert header.startswith("===== slurm: job 7_1 on ?, CUDA_VISIBLE_DEVICES=2, started ")
    assert output == "a b|'q'|\"d\"|$HOME|`id`|; echo no|x y;z"  # and its environment
    assert footer.startswith("===== slurm: job 7_1 ended with exit code 0 at ")
    assert run("0") == 3  # the task's exit code is the job's
    lines = logs[0].read_text().splitlines()
    assert lines[1] == "zero" and lines[2].startswith("===== slurm: job 7_0 ended with exit code 3 at ")
    assert run("5") == 1  # no task for that index


def test_job_script_refuses_environment_names_a_shell_cannot_export(tmp_path: Path) -> None:
    job = Job(task(), 1, Command(("true",), {"NOT-A-NAME": "1"}), str(tmp_path / "x.log"), {})
    with pytest.raises(ValueError, match="must be identifiers"):
        job_script([job])
