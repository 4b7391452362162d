"""orchestra: evaluate language models at scale, from one config file.

``orchestra.run(config, ...)`` and ``orchestra.plan(config, ...)`` are the Python API
(:mod:`orchestra.api`); ``python run.py CONFIG`` is the same through the command line.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["plan", "run"]


def __getattr__(name: str) -> Any:
    if name in ("run", "plan", "Run", "PlanView"):  # imported on use: `import orchestra.x` stays light
        from orchestra import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestra' has no attribute {name!r}")
