# A small end-to-end run that needs no ML framework: the deterministic test model on two
# tiny datasets, through SizePartitioner and LocalRunner with 2 workers.
from mmengine.config import read_base

from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .datasets.demo import demo_datasets
    from .models.deterministic import models

datasets = [*demo_datasets]
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size=800, gen_task_coef=10),
    runner=dict(type=LocalRunner, max_num_workers=2, retry=1, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = 'outputs/demo'
