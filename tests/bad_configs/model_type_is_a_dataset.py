# A model whose type is a class of another kind (a dataset).
from orchestra.datasets import JsonlDataset

models = [dict(type=JsonlDataset, abbr='m', path='x', reader_cfg=dict(), infer_cfg=dict())]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{question}'))]
