# reader_cfg names a column the data does not have.
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['prompt'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{prompt}'))]
