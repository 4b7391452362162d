"""Check a config dict's keys against the constructor of the class it configures.

A class's constructor signature is the single source of truth for which keys are valid:
unknown keys name the valid ones, missing required keys and clearly mistyped values are
errors, a class whose ``__init__`` takes ``**kwargs`` is followed up its MRO, and one that takes
``**kwargs: Unpack[SomeTypedDict]`` takes that TypedDict's keys (a runner's loop options).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from orchestra.errors import ConfigError, check_known_keys
from orchestra.keyvalues import NON_FINITE, non_finite
from orchestra.registry import Registry


def _signature_params(cls: type) -> tuple[dict[str, inspect.Parameter], bool]:
    """Named constructor parameters of ``cls`` (following ``**kwargs`` up the MRO), worked out
    once per class and constructors (a sweep's 632 entries share a few classes)."""
    return _params_of(cls, tuple(klass.__dict__.get("__init__") for klass in cls.__mro__))


@functools.lru_cache(maxsize=256)
def _params_of(cls: type, inits: tuple[Any, ...]) -> tuple[dict[str, inspect.Parameter], bool]:
    params: dict[str, inspect.Parameter] = {}
    for klass, init in zip(cls.__mro__, inits):
        if init is None:
            continue
        if klass is object:  # its ``(*args, **kwargs)`` takes nothing: a class of no __init__ takes no keys
            return params, False
        sig = inspect.signature(init)
        has_var = False
        for name, p in list(sig.parameters.items())[1:]:
            if p.kind is p.VAR_KEYWORD:
                keys = _unpacked_keys(init, p.annotation)
                if keys is None:
                    has_var = True
                for key in keys or ():
                    params.setdefault(key.name, key)
            elif p.kind is not p.VAR_POSITIONAL:
                params.setdefault(name, p)
        if not has_var:
            return params, False
    return params, True


def _unpacked_keys(init: Any, annotation: Any) -> list[inspect.Parameter] | None:
    """The keys of ``**kwargs: Unpack[SomeTypedDict]`` as optional keyword parameters (a runner's
    ``**loop: Unpack[LoopOptions]``), or None for a ``**kwargs`` that takes anything."""
    if not (isinstance(annotation, str) and annotation.startswith("Unpack[") and annotation.endswith("]")):
        return None
    typed = getattr(init, "__globals__", {}).get(annotation[len("Unpack["):-1].strip())
    if not (isinstance(typed, type) and issubclass(typed, dict) and hasattr(typed, "__total__")):
        return None
    return [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation=getattr(hint, "__forward_arg__", hint))
            for key, hint in typed.__annotations__.items()]


_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list, tuple),
    "tuple": (list, tuple),
    "dict": (dict,),
    "None": (type(None),),
}


def _type_error(value: Any, annotation: Any) -> str | None:
    """A message if ``value`` clearly does not fit a simple annotation, else None."""
    if not isinstance(annotation, str):
        return None
    allowed: list[type] = []
    for alt in annotation.split("|"):
        base = alt.strip().split("[")[0].strip()
        if base not in _SIMPLE_TYPES:
            return None  # something we do not check (Any, a class, a Union[...])
        allowed.extend(_SIMPLE_TYPES[base])
    if isinstance(value, bool) and bool not in allowed:
        return f"expected {annotation}, got {value!r}"
    if not isinstance(value, tuple(allowed)):
        return f"expected {annotation}, got {type(value).__name__} {value!r}"
    return None


def _check_finite(value: Any, where: str, param: inspect.Parameter | None) -> None:
    """Refuse a NaN or an infinity anywhere in one argument's value, nested dicts included
    (``batch=dict(poll_s=nan)``, ``server=dict(startup_timeout_s=inf)``, ``generation_kwargs``,
    ``aliyun_cfg``): this is the one place every component's settings pass through, so no key,
    today's or tomorrow's, depends on its own range check to catch them (``nan > 0`` is False,
    and ``inf > 0`` is True)."""
    bad = non_finite(value)
    if bad is None:
        return
    path, number = bad
    sub = "" if not path else path if path.startswith("[") else f".{path}"
    # a key whose own value may be None says so ("no limit", "the default"); a nested one is
    # documented with its dict
    none = " or None" if not path and param is not None and "None" in str(param.annotation) else ""
    raise ConfigError(f"{where}{sub}: expected a finite number{none}, got {number!r} ({NON_FINITE})")


def check_kwargs(cls: type, kwargs: dict[str, Any], where: str, extra: tuple[str, ...] = ()) -> None:
    """Raise ``ConfigError`` for unknown, missing or clearly mistyped constructor arguments."""
    params, open_ended = _signature_params(cls)
    valid = sorted([*params, *extra])
    if not open_ended:
        check_known_keys(kwargs, valid, where, of=f"for {cls.__name__}")
    for key, value in kwargs.items():
        problem = _type_error(value, params[key].annotation) if key in params and key not in extra else None
        if problem:
            raise ConfigError(f"{where}.{key}: {problem}")
        _check_finite(value, f"{where}.{key}", params.get(key))
    for name, p in params.items():
        if p.default is p.empty and name not in kwargs:
            raise ConfigError(f"{where}: missing required key {name!r} for {cls.__name__}")


def build_component(registry: Registry, cfg: Any, where: str, **defaults: Any) -> Any:
    """Resolve and construct a light component (partitioner); errors name ``where``."""
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise ConfigError(f"{where}: expected a dict with a 'type' key, got {cfg!r}")
    cls = registry.resolve(cfg["type"], where)
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    check_kwargs(cls, kwargs, where)
    try:
        return cls(**{**defaults, **kwargs})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


