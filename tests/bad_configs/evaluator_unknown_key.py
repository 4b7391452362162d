# A key the accuracy evaluator does not take: it has no __init__ of its own, and object's
# (*args, **kwargs) read as "takes any key", so the check passed and the eval task failed.
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{question}'),
                 eval_cfg=dict(evaluator=dict(type='accuracy', ignore_case=True)))]
