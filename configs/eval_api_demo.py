# API models end to end: a single-turn and a multi-turn dataset against an OpenAI-compatible
# endpoint.  Try it with the test server:
#   python tests/servers/openai_server.py --port 8000 --latency-s 0.05 &
#   python run.py configs/eval_api_demo.py
from mmengine.config import read_base

from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .datasets.chat_arith import chat_arith_datasets
    from .datasets.demo import demo_datasets
    from .models.api_local import models

datasets = [demo_datasets[0], *chat_arith_datasets]
infer = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, retry=1,
                task=dict(type=InferTask, max_samples=128, error_tolerance=0.0)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = 'outputs/api_demo'
