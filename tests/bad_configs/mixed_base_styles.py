# _base_ inheritance from a read_base() config (mmengine cannot mix the two styles).
_base_ = ['../../configs/eval_demo.py']
work_dir = 'outputs/mixed'
