"""The Slurm backend: srun processes or sbatch job arrays, watched with squeue (see docs/slurm.md)."""

from orchestra.runners.slurm.runner import LAUNCHERS, SlurmRunner, job_name, run_tag, time_limit_minutes

__all__ = ["LAUNCHERS", "SlurmRunner", "job_name", "run_tag", "time_limit_minutes"]
