# LLM-as-judge end to end: the multi-turn demo answered by an OpenAI-compatible endpoint and
# graded 1-10, turn by turn, by a judge model behind an endpoint (here the same one), with
# the built-in MT-Bench-style prompt.  Try the plumbing with the test server:
#   python tests/servers/openai_server.py --port 8000 --latency-s 0.05 &
#   python run.py configs/eval_judge_demo.py
# The test server does not grade, so every judgement is reported as judge_unparsed (never as
# a 0); point _judge at a real model (a vLLM / llama.cpp server, an API) for grades.
from mmengine.config import read_base

from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .models.api_local import models

_judge = dict(type=OpenAIAPI, abbr='judge', path='judge-model', base_url='http://127.0.0.1:8000/v1',
             key_env='ORCHESTRA_JUDGE_KEY', max_connections=8, max_out_len=512)
datasets = [
    dict(type=JsonlDataset, abbr='chat_arith_judged', path='configs/data/chat_arith.jsonl',
         reader_cfg=dict(input_columns=['turns'], output_column='answer'),
         infer_cfg=dict(prompt_template='', inferencer=dict(type='chat', turns_column='turns', max_out_len=32)),
         eval_cfg=dict(evaluator=dict(type='judge', judge=_judge, mode='single'))),
]
infer = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = 'outputs/judge_demo'
