"""The Ray backend: warm workers as Ray actors (docs/ray.md).  Importing it never imports ``ray``:
``backend``, ``pool`` and ``session`` do, and only ``RayRunner.open`` imports them."""

from orchestra.runners.ray.runner import RayRunner

__all__ = ["RayRunner"]
