"""Partitioners: how a stage's work is cut into tasks."""

from orchestra.partitioners.base import BasePartitioner
from orchestra.partitioners.naive import NaivePartitioner
from orchestra.partitioners.num_worker import NumWorkerPartitioner
from orchestra.partitioners.size import SizePartitioner

__all__ = ["BasePartitioner", "NaivePartitioner", "NumWorkerPartitioner", "SizePartitioner"]
