# Two tiny datasets shipped in configs/data.  A relative path is looked up from where orchestra
# runs, then from the config file's folder and the folders above it (docs/user-guide.md).
from orchestra.datasets import JsonlDataset

demo_datasets = [
    dict(type=JsonlDataset, abbr='arith', path='configs/data/arith.jsonl',
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='Question: {question}\nAnswer:',
                        inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),
    dict(type=JsonlDataset, abbr='capitals', path='configs/data/capitals.jsonl',
         reader_cfg=dict(input_columns=['question'], output_column='label'),
         infer_cfg=dict(prompt_template='{question}',
                        inferencer=dict(type='loglik', choices_column='choices')),
         eval_cfg=dict(evaluator=dict(type='accuracy'))),
]
