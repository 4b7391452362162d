"""``--slurm`` / ``--dlc`` with ``--cfg-options`` for the new runner, as the user guide's precedence
(config file < --cfg-options < CLI flags) promises: the options given on the command line are kept
when the flag replaces a config's LocalRunner, never dropped without a word."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli


def _task_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.lstrip().startswith("$ ")]


def test_slurm_switch_keeps_the_runner_options_given_with_cfg_options(tmp_path: Path) -> None:
    """``--slurm -p debug --cfg-options infer.runner.time_limit=60`` on a LocalRunner config: the
    infer jobs ask for ``--time=60`` (the option was dropped with the LocalRunner it was set on)."""
    done = run_cli("configs/eval_demo.py", "--slurm", "-p", "debug", "-w", tmp_path / "out", "--dry-run",
                   "--cfg-options", "infer.runner.time_limit=60", "infer.runner.cpus_per_task=2", timeout=60)
    assert done.returncode == 0, done.stderr
    infer = [line for line in _task_lines(done.stdout) if "orchestra.tasks.infer" in line]
    evals = [line for line in _task_lines(done.stdout) if "orchestra.tasks.eval" in line]
    assert infer and evals
    assert all("--time=60" in line and "--cpus-per-task=2" in line for line in infer)
    assert not any("--time=" in line for line in evals)  # only the stage the option named


def test_a_cfg_option_the_new_runner_does_not_take_is_refused_not_dropped(tmp_path: Path) -> None:
    done = run_cli("configs/eval_demo.py", "--slurm", "-p", "debug", "-w", tmp_path / "out", "--dry-run",
                   "--cfg-options", "infer.runner.reuse_workers=True", timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'reuse_workers' for SlurmRunner" in lines[0], done.stderr


def test_dlc_switch_keeps_the_runner_options_given_with_cfg_options(tmp_path: Path) -> None:
    aliyun = tmp_path / "aliyun.cfg"
    aliyun.write_text("workspace_id = '1'\nresource_id = 'q'\nworker_image = 'img:1'\n")
    done = run_cli("configs/eval_demo.py", "--dlc", "--aliyun-cfg", aliyun, "-w", tmp_path / "out", "--dry-run",
                   "--cfg-options", "infer.runner.dlc_bin=/opt/site/dlc", timeout=60)
    assert done.returncode == 0, done.stderr
    infer = [line for line in _task_lines(done.stdout) if "infer_" in line]
    assert infer and all("/opt/site/dlc submit" in line for line in infer), infer[:1]
