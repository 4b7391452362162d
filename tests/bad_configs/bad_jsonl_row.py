# A data file with a line that is not JSON.
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='broken', path='tests/bad_configs/broken.jsonl',
                 reader_cfg=dict(input_columns=['question']), infer_cfg=dict(prompt_template='{question}'))]
