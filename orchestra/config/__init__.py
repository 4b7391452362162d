"""A run's config: loaded (:mod:`.load`), checked against the classes it names
(:mod:`.schema`, :mod:`.validate`) and saved without secrets (:mod:`.dump`)."""

from orchestra.config.dump import dump_config, redact
from orchestra.config.load import load_config, to_plain
from orchestra.config.schema import build_component, check_kwargs
from orchestra.config.validate import DEFAULT_STAGES, RunConfig, StageConfig, validate
from orchestra.secretnames import SECRET_KEY

__all__ = [
    "DEFAULT_STAGES",
    "SECRET_KEY",
    "RunConfig",
    "StageConfig",
    "build_component",
    "check_kwargs",
    "dump_config",
    "load_config",
    "redact",
    "to_plain",
    "validate",
]
