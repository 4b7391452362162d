# A secret given in clear in Ray's runtime_env (it would be in the run's config.py, and Ray keeps
# a job's runtime_env in its cluster state).
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.runners import RayRunner
from orchestra.tasks import InferTask

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(runner=dict(type=RayRunner, task=dict(type=InferTask),
                         runtime_env=dict(env_vars=dict(OMP_NUM_THREADS='1', AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI-not-real-4567'))))
