"""SlurmRunner's commands, options and Slurm-output parsing, without a cluster."""

from __future__ import annotations

import ast
import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.cluster.slurm import SlurmJobState, parse_squeue
from orchestra.errors import ConfigError
from orchestra.runners.core.contract import Exit
from orchestra.runners.core.proc import describe_status
from orchestra.runners.slurm.runner import SlurmRunner, job_name, run_tag, time_limit_minutes
from orchestra.runners.slurm.script import sbatch_long_options
from orchestra.runners.slurm.state import exit_of, srun_exit
from orchestra.tasks.spec import TaskSpec

REPO = Path(__file__).resolve().parents[3]


def spec(task_id: str = "infer_m_a", num_gpus: int = 0) -> TaskSpec:
    return TaskSpec(stage="infer", task_id=task_id, run_dir="/r", model={"abbr": "m"}, model_abbr="m", units=(),
                    num_gpus=num_gpus)


def command(runner: SlurmRunner, task: TaskSpec, root: Path, attempt: int = 1) -> tuple[list[str], dict[str, str]]:
    task = dataclasses.replace(task, run_dir=str(root))  # the run folder the task's spec is in
    cmd = runner.get_command(task, str(root / "tasks" / f"{task.task_id}.py"), {}, attempt,
                             str(root / "logs" / "infer" / f"{task.task_id}.log"))
    return list(cmd.argv), cmd.env


def test_srun_line_carries_resources_and_a_unique_job_name(tmp_path: Path) -> None:
    runner = SlurmRunner(partition="gpu", qos="high", cpus_per_task=4, mem_gb=1.5, time_limit="1:30:00",
                         extra_args="--account=proj --exclusive")
    argv, env = command(runner, spec(num_gpus=2), tmp_path, attempt=3)
    name = f"orc-{run_tag(str(tmp_path))}-infer_m_a-a3"
    assert argv[: argv.index("bash")] == [
        "srun", f"--job-name={name}", "--nodes=1", "--ntasks=1", "--unbuffered", "--partition=gpu", "--qos=high",
        "--gres=gpu:2", "--cpus-per-task=4", "--mem=1536M", "--time=1:30:00", "--account=proj", "--exclusive",
    ]
    assert argv[-4:] == [sys.executable, "-m", "orchestra.tasks.infer", str(tmp_path / "tasks" / "infer_m_a.py")]
    assert "CUDA_VISIBLE_DEVICES" not in env  # Slurm sets it from --gres
    assert env["ORCHESTRA_ATTEMPT"] == "3"


def test_task_without_gpus_requests_no_gres(tmp_path: Path) -> None:
    argv, _ = command(SlurmRunner(gres="gpu:a100:{num_gpus}"), spec(), tmp_path)
    assert not [a for a in argv if a.startswith("--gres")]
    argv, _ = command(SlurmRunner(gres="gpu:a100:{num_gpus}"), spec(num_gpus=1), tmp_path)
    assert "--gres=gpu:a100:1" in argv


def test_srun_template_is_the_whole_command_filled_per_argument(tmp_path: Path) -> None:
    odd = tmp_path / "a b'c\"d; rm -rf x"
    runner = SlurmRunner(partition="p q", template="srun -p {partition} --gres=gpu:{num_gpus} -J {job_name} {task_cmd}")
    argv, env = command(runner, spec(num_gpus=1), odd)
    name = f"orc-{run_tag(str(odd))}-infer_m_a-a1"
    assert argv[:6] == ["srun", "-p", "p q", "--gres=gpu:1", "-J", name]
    assert argv[6:] == [sys.executable, "-m", "orchestra.tasks.infer", str(odd / "tasks" / "infer_m_a.py")]
    assert env["SLURM_JOB_NAME"] == name  # cancel finds the job by name even if the template has no -J


def test_other_templates_run_inside_the_job(tmp_path: Path) -> None:
    argv, _ = command(SlurmRunner(template="apptainer exec img.sif {task_cmd}"), spec(), tmp_path)
    assert argv[0] == "srun" and argv[argv.index("orchestra-task") + 1 :][:3] == ["apptainer", "exec", "img.sif"]
    argv, _ = command(SlurmRunner(launcher="sbatch", template="apptainer exec img.sif {task_cmd}"), spec(), tmp_path)
    assert argv[:3] == ["apptainer", "exec", "img.sif"] and argv[3] == sys.executable


def test_srun_header_wrapper_passes_argv_through_untouched(tmp_path: Path) -> None:
    # The in-job header is printed by bash, and the task's argv reaches exec as "$@".
    argv, _ = command(SlurmRunner(), spec(), tmp_path)
    wrapper = argv[argv.index("bash") :]
    hostile = ["printf", "%s|", "a b", "'q'", '"d"', "$HOME", "`id`", "; echo no"]
    out = subprocess.run([*wrapper[:4], *hostile], capture_output=True, text=True, check=True,
                         env={"CUDA_VISIBLE_DEVICES": "2", "SLURM_JOB_ID": "7"}).stdout
    header, _, rest = out.partition("\n")
    assert header.startswith("===== slurm: job 7 on ?, CUDA_VISIBLE_DEVICES=2, started ")
    assert rest == "a b|'q'|\"d\"|$HOME|`id`|; echo no|"


def test_sbatch_mode_runs_the_task_argv_in_the_job(tmp_path: Path) -> None:
    argv, env = command(SlurmRunner(launcher="sbatch"), spec(num_gpus=1), tmp_path)
    assert argv == [sys.executable, "-m", "orchestra.tasks.infer", str(tmp_path / "tasks" / "infer_m_a.py")]
    assert "SLURM_JOB_NAME" not in env and "CUDA_VISIBLE_DEVICES" not in env


@pytest.mark.parametrize("kwargs, message", [
    ({"launcher": "qsub"}, "launcher must be one of 'srun', 'sbatch'"),
    ({"time_limit": "soon"}, "time_limit 'soon'"),
    ({"time_limit": 0}, "time_limit must be >= 1 minute"),
    ({"cpus_per_task": 0}, "cpus_per_task must be an integer >= 1"),
    ({"mem_gb": -1}, "mem_gb must be > 0"),
    ({"partition": ""}, "partition must be a non-empty string"),
    ({"gres": "gpu:{count}"}, "only the field {num_gpus}"),
    ({"launcher": "sbatch", "template": "srun -p x {task_cmd}"}, "a template that starts with srun needs"),
    ({"launcher": "sbatch", "extra_args": ["-A", "x"]}, "give sbatch options in long form"),
    ({"time_limit": "0:00"}, "time_limit '0:00' must be at least one second"),
    ({"extra_args": ["--exclusive", 3]}, "extra_args must be a list of strings, got "),
])
def test_bad_options_are_refused_with_the_reason(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, ConfigError), match=message.replace("(", r"\(").replace("{", r"\{")):
        SlurmRunner(**kwargs)


def test_unknown_template_field_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid: .*job_name.*partition"):
        SlurmRunner(template="srun --account={account} {task_cmd}")


@pytest.mark.parametrize("spec_, minutes", [
    (5, 5), ("5", 5), ("0:30", 1), ("1:30", 2), ("1:00:00", 60), ("1:00:01", 61), ("2-0", 2880),
    ("1-2:30", 1590), ("1-00:00:30", 1441),
])
def test_time_limit_in_minutes(spec_: int | str, minutes: int) -> None:
    assert time_limit_minutes(spec_) == minutes


def test_job_names_are_unique_per_run_task_and_attempt() -> None:
    assert run_tag("/a/b") == run_tag("/a/b/") != run_tag("/a/c")
    assert job_name("12345678", "infer_m_a+1", 2) == "orc-12345678-infer_m_a+1-a2"
    assert "," not in job_name("12345678", "x,y z", 1)  # squeue --name takes a comma-separated list


def test_parse_squeue_expands_pending_array_ranges() -> None:
    text = "232_[2-4,7%2]|PENDING|0|JobArrayTaskLimit|\n232_1|RUNNING|0|None|\n233|FAILED|35072|NonZeroExitCode|\n" \
           "234|CANCELLED by 0|15|None|\n"
    infos = parse_squeue(text)
    assert sorted(infos) == ["232_1", "232_2", "232_3", "232_4", "232_7", "233", "234"]
    assert infos["232_3"].state == "PENDING" and not infos["232_3"].terminal
    assert infos["233"] == SlurmJobState("233", "FAILED", 137 << 8, "NonZeroExitCode")
    assert infos["234"].state == "CANCELLED" and infos["234"].terminal


def test_exit_reasons_name_what_slurm_did() -> None:
    assert exit_of(SlurmJobState("5", "COMPLETED", 0), None, None).code == 0
    assert exit_of(SlurmJobState("5", "FAILED", 3 << 8), None, None).reason == "Slurm job 5 failed with exit code 3"
    assert exit_of(SlurmJobState("5", "TIMEOUT", 15), "10", None).reason == \
        "Slurm time limit (time_limit=10) reached by Slurm job 5"
    assert "cancelled (scancel)" in exit_of(SlurmJobState("5_1", "CANCELLED", 15), None, None).reason
    assert "preempted" in exit_of(SlurmJobState("5", "PREEMPTED", 15), None, None).reason
    assert "mem_gb=4" in exit_of(SlurmJobState("5", "OUT_OF_MEMORY", 9), None, 4).reason
    assert describe_status(9) == (-9, "signal SIGKILL")


@pytest.mark.parametrize("state, infra", [
    ("PREEMPTED", True), ("NODE_FAIL", True), ("BOOT_FAIL", True),  # the cluster's doing: retry is not spent
    ("COMPLETED", False), ("FAILED", False), ("TIMEOUT", False), ("CANCELLED", False), ("OUT_OF_MEMORY", False),
    ("DEADLINE", False),
])
def test_only_what_the_cluster_did_is_an_infrastructure_exit(state: str, infra: bool) -> None:
    ended = exit_of(SlurmJobState("5", state, 15 if state != "COMPLETED" else 0), None, None)
    assert ended.infra is infra
    assert (ended.code != 0) is (state != "COMPLETED")


def test_srun_sees_preemption_and_node_failure_as_infrastructure() -> None:
    line = "slurmstepd-localhost: error: *** JOB 31 ON localhost CANCELLED AT 2026-11-22T04:50:30 DUE TO {} ***\n"
    preempted = srun_exit(143, line.format("PREEMPTION"), None)
    assert preempted.infra and preempted.reason == "Slurm job 31 was preempted"
    node = srun_exit(143, line.format("NODE FAILURE"), None)
    assert node.infra and node.reason == "Slurm job 31 failed: its node failed"
    assert not srun_exit(143, line.format("TIME LIMIT"), "5").infra
    assert not srun_exit(1, "boom\n", None).infra


def test_srun_exit_reads_what_slurm_wrote() -> None:
    limit = ("srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
             "slurmstepd-localhost: error: *** STEP 221.0 ON localhost CANCELLED AT 2026-11-22T04:52:13 "
             "DUE TO TIME LIMIT ***\nsrun: error: localhost: task 0: Terminated\n")
    assert srun_exit(143, limit, "1").reason == "Slurm time limit (time_limit=1) reached by Slurm job 221"
    cancelled = "slurmstepd-localhost: error: *** STEP 214.0 ON localhost CANCELLED AT 2026-11-22T04:50:30 ***\n"
    assert srun_exit(143, cancelled, None).reason == "Slurm job 214 was cancelled (scancel) after it was submitted"
    alloc = "srun: error: Unable to allocate resources: Invalid partition name specified\n"
    assert srun_exit(1, alloc, None).reason == "srun could not allocate the job: Invalid partition name specified"
    plain = "===== slurm: job 9 on n1, CUDA_VISIBLE_DEVICES=, started 1.0\nTraceback ...\n"
    assert srun_exit(1, plain, None) == srun_exit(1, plain, None)
    assert srun_exit(1, plain, None).reason == "exit code 1 (Slurm job 9)"


def test_srun_exit_of_a_job_over_its_memory_or_an_srun_killed_by_a_signal() -> None:
    oom = "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=5.0.\n"
    assert srun_exit(137, oom, None) == Exit(137, "out of memory (Slurm's memory limit)")
    assert srun_exit(-9, "", None) == Exit(-9, "srun killed by signal SIGKILL")


def test_extra_sbatch_args_become_one_argument_per_long_option() -> None:
    assert sbatch_long_options(["--account=x", "--exclusive", "--constraint", "a100", "--mail-type=END"]) == [
        "--account=x", "--exclusive", "--constraint=a100", "--mail-type=END"]


def test_dry_run_shows_the_srun_line(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.py"
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "What is 1 + 1?", "a": "2"}\n')
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
models = [dict(type=DeterministicModel, abbr='det', run_cfg=dict(num_gpus=1))]
datasets = [dict(type=JsonlDataset, abbr='d', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='a'),
                 infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='gen', max_out_len=4)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    res = subprocess.run([sys.executable, "run.py", str(cfg), "--slurm", "-p", "gpu", "-q", "high", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "$ " in ln and "srun --job-name" in ln)
    argv = shlex.split(line.strip().removeprefix("$ "))
    assert "--partition=gpu" in argv and "--qos=high" in argv and "--gres=gpu:1" in argv


def test_slurm_modules_import_one_way() -> None:
    # runner -> launchers -> recover, script -> common -> watch -> state (lazy imports too: no cycle)
    layers = [{"runner"}, {"batch", "srun"}, {"recover", "script"}, {"common"}, {"watch"}, {"state"}]
    level = {name: i for i, names in enumerate(layers) for name in names}
    for name, i in level.items():
        tree = ast.parse((REPO / "orchestra" / "runners" / "slurm" / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        for module in imported:
            other = module.removeprefix("orchestra.runners.slurm.")
            if other in level:
                assert level[other] > i, f"{name} imports {module}, which is not below it"


def test_the_batch_script_sources_the_private_file_first_and_exits_97_without_it(tmp_path: Path) -> None:
    """The job script of ``launcher='sbatch'`` run by a real bash, outside Slurm: the private file's
    variable reaches the task (its argv prints it), and a file that cannot be read ends the job with
    97 and one line naming it, before the task runs."""
    from orchestra.envfile import write_env_file
    from orchestra.runners.core.command import Command
    from orchestra.runners.core.contract import Job
    from orchestra.runners.slurm.script import job_script

    task = TaskSpec(stage="infer", task_id="t0", run_dir=str(tmp_path), model={}, model_abbr="m", units=())
    log = tmp_path / "t0.log"
    job = Job(task, 1, Command(("bash", "-c", 'echo "got:$ORC_UNIT_API_KEY"'), {}), str(log), {})
    env_file = tmp_path / "slurm" / "private" / "infer.env"
    write_env_file(str(env_file), ["ORC_UNIT_API_KEY"], {"ORC_UNIT_API_KEY": "v a'l$ue"})
    script = tmp_path / "job.sh"
    script.write_text(job_script([job], ["--parsable"], str(env_file)))
    assert "v a'l$ue" not in script.read_text()
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stderr
    assert "got:v a'l$ue" in log.read_text()
    env_file.unlink()
    log.unlink()
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 97 and str(env_file) in res.stderr and not log.exists()
