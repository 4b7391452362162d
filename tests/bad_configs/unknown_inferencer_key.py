# An inferencer key gen does not accept.
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question']),
                 infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_new_tokens=8)))]
