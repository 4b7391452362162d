# Code execution end to end: SmolLM2 (CPU) on the first 10 problems of HumanEval and MBPP,
# each completion run in a sandbox.  A 135M model solves almost none: this shows the
# pipeline, not a score.  Needs bubblewrap or root for 'unshare' (see docs/scoring.md).
#   python run.py configs/eval_code_demo.py
from mmengine.config import read_base

from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .datasets.humaneval import humaneval_datasets
    from .datasets.mbpp import mbpp_datasets
    from .models.smollm2_135m import models

datasets = [
    {**humaneval_datasets[0], 'reader_cfg': {**humaneval_datasets[0]['reader_cfg'], 'test_range': '[0:10]'},
     'infer_cfg': {**humaneval_datasets[0]['infer_cfg'],
                   'inferencer': {**humaneval_datasets[0]['infer_cfg']['inferencer'], 'max_out_len': 128}}},
    {**mbpp_datasets[0], 'reader_cfg': {**mbpp_datasets[0]['reader_cfg'], 'test_range': '[0:10]'},
     'infer_cfg': {**mbpp_datasets[0]['infer_cfg'],
                   'inferencer': {**mbpp_datasets[0]['infer_cfg']['inferencer'], 'max_out_len': 128}}},
]
infer = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = 'outputs/code_demo'
