# A dataset file that does not exist.
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='gone', path='tests/bad_configs/no_such_file.jsonl',
                 reader_cfg=dict(input_columns=['question']), infer_cfg=dict(prompt_template='{question}'))]
