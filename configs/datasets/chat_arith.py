# A multi-turn demo: three user turns per conversation, each sent the moment the previous
# reply arrives.  The last reply is scored against the final answer.
from orchestra.datasets import JsonlDataset

chat_arith_datasets = [
    dict(type=JsonlDataset, abbr='chat_arith', path='configs/data/chat_arith.jsonl',
         reader_cfg=dict(input_columns=['turns'], output_column='answer'),
         infer_cfg=dict(prompt_template='', inferencer=dict(type='chat', turns_column='turns', max_out_len=32)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),
]
