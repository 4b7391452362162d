# An API key in a URL's query (Google's ?key=, Azure's api-key=): saved with the config otherwise.
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI

models = [dict(type=OpenAIAPI, abbr='gem', path='gemini-2.0-flash', key_env=None,
               base_url='https://generativelanguage.googleapis.com/v1beta/openai?key=AIza-not-real-0123')]
datasets = [dict(type=JsonlDataset, abbr='tiny', path='tests/bad_configs/tiny.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
