# Error bars and paired differences in seconds, no ML framework (docs/statistics.md): the
# deterministic model against a copy of it that writes at most two characters, so every
# arith answer of three digits comes out cut ("148" -> "14") and counts as wrong.
#
#   python run.py configs/eval_stats_demo.py
from mmengine.config import read_base

from orchestra.models import DeterministicModel

with read_base():
    from .datasets.demo import demo_datasets
    from .models.deterministic import models as _deterministic

# arith without a length of its own, so that each model's max_out_len applies
_arith, _capitals = demo_datasets
_arith = {**_arith, 'infer_cfg': {**_arith['infer_cfg'], 'inferencer': dict(type='gen')}}
models = [*_deterministic, dict(type=DeterministicModel, abbr='det-short', max_out_len=2, batch_size=8)]
datasets = [_arith, _capitals]
summarizer = dict(baseline='deterministic')
work_dir = 'outputs/stats_demo'
