"""orchestra: evaluate language models at scale, from one config file.

``orchestra.run(config, ...)`` and ``orchestra.plan(config, ...)`` are the Python API
(:mod:`orchestra.api`); ``python run.py CONFIG`` is the same through the command line.
``orchestra.compare([run_a, run_b, ...])`` compares run folders sample by sample
(:mod:`orchestra.comparison`; ``orchestra compare RUN_A RUN_B`` on the command line).
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["compare", "plan", "run"]


def __getattr__(name: str) -> Any:
    if name in ("run", "plan", "Run", "PlanView"):  # imported on use: `import orchestra.x` stays light
        from orchestra import api

        return getattr(api, name)
    if name == "compare":
        from orchestra.comparison import compare

        return compare
    raise AttributeError(f"module 'orchestra' has no attribute {name!r}")
