# max_num_workers below 1.
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

from orchestra.runners import LocalRunner
from orchestra.tasks import InferTask
models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(runner=dict(type=LocalRunner, max_num_workers=-1, task=dict(type=InferTask)))
