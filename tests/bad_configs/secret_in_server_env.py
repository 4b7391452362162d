# A secret given in clear in the environment of a managed server's replicas (a name the config-key
# check alone does not see: its last word is KEY).
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI

models = [dict(type=OpenAIAPI, abbr='served', path='m',
               server=dict(engine='command', model='tests/bad_configs/tiny.jsonl', command=['python', '-m', 'http.server', '{port}'],
                           env=dict(HF_HOME='/tmp/hf', AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI-not-real-0123')))]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
