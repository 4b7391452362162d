from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='deterministic', batch_size=8)]
