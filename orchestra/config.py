"""Load, override, validate and save a run's config.

Everything a user can get wrong is checked here, before anything runs, and reported as a
one-line ``ConfigError`` naming the file and the key.  Classes named by ``type`` are
resolved and their constructor signatures are the single source of truth for which keys
are valid.  Models are only checked, never built: building one may load weights.
"""

from __future__ import annotations

import inspect
import os
import pprint
import re
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ConfigError
from orchestra.registry import DATASETS, EVALUATORS, MODELS, PARTITIONERS, RUNNERS, TASKS, Registry

TOP_LEVEL_KEYS = ("models", "datasets", "infer", "eval", "work_dir")
STAGE_KEYS = ("partitioner", "runner")
RUN_CFG_KEYS = ("num_gpus", "num_procs")
# Keys of a dataset's sub-configs; a dataset class may widen them with class attributes of
# the same names in lower case (``reader_cfg_keys = (...)``).
READER_CFG_KEYS = ("input_columns", "output_column", "test_range")
INFER_CFG_KEYS = ("prompt_template", "inferencer", "fewshot", "fewshot_template")
EVAL_CFG_KEYS = ("evaluator",)
FEWSHOT_KEYS = ("k", "source", "separator")
SECRET_KEY = re.compile(r"(^|_)(api_?key|token|secret|password)$", re.IGNORECASE)
DEFAULT_STAGES: dict[str, dict[str, Any]] = {
    "infer": {
        "partitioner": {"type": "NaivePartitioner"},
        "runner": {"type": "LocalRunner", "task": {"type": "InferTask"}},
    },
    "eval": {
        "partitioner": {"type": "NaivePartitioner"},
        "runner": {"type": "LocalRunner", "task": {"type": "EvalTask"}},
    },
}


@dataclass
class StageConfig:
    """A stage's partitioner (built) and runner (class plus validated arguments)."""

    name: str
    partitioner: Any
    runner_cls: type
    runner_kwargs: dict[str, Any]
    task_cfg: dict[str, Any]


@dataclass
class RunConfig:
    """A validated config, ready to plan and run."""

    source: str
    models: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    stages: dict[str, StageConfig]
    work_dir: str
    resolved: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# loading


def load_config(path: str, cfg_options: list[str] | None = None) -> dict[str, Any]:
    """Read a ``.py`` / ``.yaml`` / ``.json`` config and apply ``a.b=value`` overrides."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found")
    ext = os.path.splitext(path)[1]
    if ext not in (".py", ".yaml", ".yml", ".json"):
        raise ConfigError(f"{path}: unsupported config type {ext!r}; use .py, .yaml or .json")
    from mmengine.config import Config, DictAction

    try:
        cfg = Config.fromfile(path)
    except SyntaxError as exc:
        line = f" line {exc.lineno}" if exc.lineno else ""
        raise ConfigError(f"{path}:{line} syntax error: {exc.msg}") from None
    except Exception as exc:  # mmengine wraps user-code errors in many types
        raise ConfigError(f"{_where_in_config(exc, path)}: cannot load config: {_load_problem(exc)}") from None
    if cfg_options:
        overrides: dict[str, Any] = {}
        for item in cfg_options:
            if "=" not in item:
                raise ConfigError(f"--cfg-options {item!r}: expected KEY=VALUE")
            key, value = item.split("=", 1)
            overrides[key] = DictAction._parse_iterable(value)
        try:
            cfg.merge_from_dict(overrides)
        except Exception as exc:
            raise ConfigError(f"--cfg-options: {exc}") from None
    return to_plain(cfg.to_dict())


def _load_problem(exc: BaseException) -> str:
    """What went wrong while a config file was executed, in one line."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if (
        isinstance(exc, RuntimeError)
        and not str(exc)
        and frames
        and frames[-1].filename.endswith(os.path.join("mmengine", "config", "lazy.py"))
    ):
        # mmengine turns every import of a pure-Python config into a placeholder, and calling
        # one raises a bare RuntimeError() that says nothing.
        return (
            "an imported name was called while the config loaded; in a .py config imports are "
            "placeholders (mmengine lazy import) and cannot be called; use plain values"
        )
    return _one_line(exc)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[-1].strip() if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _where_in_config(exc: BaseException, path: str) -> str:
    """``file:line`` of the deepest traceback frame in user code (not orchestra, not installed packages)."""
    import traceback

    own = os.path.dirname(os.path.abspath(__file__)) + os.sep
    where = path
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if "site-packages" in name or name.startswith("<") or os.path.abspath(name).startswith(own):
            continue
        where = f"{os.path.relpath(name)}:{frame.lineno}"
    return where


def to_plain(obj: Any) -> Any:
    """Plain containers with classes replaced by their dotted import paths."""
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    if callable(obj) and hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
        return f"{obj.__module__}.{obj.__qualname__}"
    return obj


# --------------------------------------------------------------------------------------
# checking keys against constructor signatures


def _signature_params(cls: type) -> tuple[dict[str, inspect.Parameter], bool]:
    """Named constructor parameters of ``cls`` (following ``**kwargs`` up the MRO)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        sig = inspect.signature(init)
        has_var = False
        for name, p in list(sig.parameters.items())[1:]:
            if p.kind is p.VAR_KEYWORD:
                has_var = True
            elif p.kind is not p.VAR_POSITIONAL:
                params.setdefault(name, p)
        if not has_var:
            return params, False
    return params, True


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


def check_kwargs(cls: type, kwargs: dict[str, Any], where: str, extra: tuple[str, ...] = ()) -> None:
    """Raise ``ConfigError`` for unknown, missing or clearly mistyped constructor arguments."""
    params, open_ended = _signature_params(cls)
    valid = sorted([*params, *extra])
    for key, value in kwargs.items():
        if key in extra:
            continue
        if key not in params:
            if open_ended:
                continue
            raise ConfigError(f"{where}: unknown key {key!r} for {cls.__name__}; valid keys: {', '.join(valid)}")
        problem = _type_error(value, params[key].annotation)
        if problem:
            raise ConfigError(f"{where}.{key}: {problem}")
    for name, p in params.items():
        if p.default is p.empty and name not in kwargs:
            raise ConfigError(f"{where}: missing required key {name!r} for {cls.__name__}")


def _build(registry: Registry, cfg: Any, where: str, **defaults: Any) -> Any:
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


# --------------------------------------------------------------------------------------
# the whole config


def _check_secrets(obj: Any, where: str, top: bool = False) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            key_where = f"{where}: {k}" if top else f"{where}.{k}"
            if SECRET_KEY.search(str(k)) and v not in (None, ""):
                raise ConfigError(
                    f"{key_where}: secrets do not belong in a config; put it in an environment "
                    "variable and give its name (e.g. key_env='OPENAI_API_KEY')"
                )
            _check_secrets(v, key_where)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_secrets(v, f"{where}[{i}]")


def _check_model(cfg: Any, where: str) -> dict[str, Any]:
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise ConfigError(f"{where}: a model is a dict with 'type' and 'abbr', got {cfg!r}")
    cls = MODELS.resolve(cfg["type"], where)
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    check_kwargs(cls, kwargs, where, extra=("run_cfg",))
    run_cfg = cfg.get("run_cfg", {})
    if not isinstance(run_cfg, dict):
        raise ConfigError(f"{where}.run_cfg: expected a dict with {', '.join(RUN_CFG_KEYS)}")
    for key, value in run_cfg.items():
        if key not in RUN_CFG_KEYS:
            raise ConfigError(f"{where}.run_cfg: unknown key {key!r}; valid keys: {', '.join(RUN_CFG_KEYS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}.run_cfg.{key}: expected an integer >= 0, got {value!r}")
    if getattr(cls, "validate_by_construction", False):
        init_kwargs = {k: v for k, v in kwargs.items() if k != "run_cfg"}
        try:
            cls(**init_kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return {**cfg, "type": f"{cls.__module__}.{cls.__qualname__}"}


def _check_keys(sub: dict[str, Any], valid: tuple[str, ...], where: str) -> None:
    for key in sub:
        if key not in valid:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(valid))}")


def _check_dataset(cfg: Any, where: str, config_dir: str = "") -> dict[str, Any]:
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise ConfigError(f"{where}: a dataset is a dict with 'type', 'abbr', 'path', got {cfg!r}")
    cls = DATASETS.resolve(cfg["type"], where)
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    check_kwargs(cls, kwargs, where)
    for key, default in (("reader_cfg", READER_CFG_KEYS), ("infer_cfg", INFER_CFG_KEYS), ("eval_cfg", EVAL_CFG_KEYS)):
        sub = cfg.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise ConfigError(f"{where}.{key}: expected a dict, got {sub!r}")
        _check_keys(sub, getattr(cls, f"{key}_keys", default), f"{where}.{key}")
    reader = cfg.get("reader_cfg") or {}
    for key in ("input_columns",):
        cols = reader.get(key)
        if cols is not None and (not isinstance(cols, (list, tuple)) or not all(isinstance(c, str) for c in cols)):
            raise ConfigError(f"{where}.reader_cfg.{key}: expected a list of column names, got {cols!r}")
    infer_cfg = cfg.get("infer_cfg") or {}
    few = infer_cfg.get("fewshot")
    if few is not None:
        if not isinstance(few, dict):
            raise ConfigError(f"{where}.infer_cfg.fewshot: expected a dict such as dict(k=5), got {few!r}")
        _check_keys(few, FEWSHOT_KEYS, f"{where}.infer_cfg.fewshot")
    from orchestra.datasets.base import INFERENCER_KEYS

    inf = infer_cfg.get("inferencer", {"type": "gen"})
    if isinstance(inf, str):
        inf = {"type": inf}
    if not isinstance(inf, dict):
        raise ConfigError(f"{where}.infer_cfg.inferencer: expected a dict such as dict(type='gen'), got {inf!r}")
    kind = inf.get("type", "gen")
    if kind not in INFERENCER_KEYS:
        raise ConfigError(
            f"{where}.infer_cfg.inferencer.type: {kind!r} is not valid; valid: {', '.join(INFERENCER_KEYS)}"
        )
    for key in inf:
        if key not in INFERENCER_KEYS[kind]:
            raise ConfigError(
                f"{where}.infer_cfg.inferencer: unknown key {key!r} for {kind}; "
                f"valid keys: {', '.join(sorted(INFERENCER_KEYS[kind]))}"
            )
    if kind == "loglik" and not inf.get("choices_column") and not inf.get("choices"):
        raise ConfigError(f"{where}.infer_cfg.inferencer: loglik needs choices_column (a column) or choices (a list)")
    if kind == "chat" and not inf.get("turns_column"):
        raise ConfigError(f"{where}.infer_cfg.inferencer: chat needs turns_column (a column of user turns)")
    evaluator = (cfg.get("eval_cfg") or {}).get("evaluator")
    if evaluator is not None:
        ev = evaluator if isinstance(evaluator, dict) else {"type": evaluator}
        ev_cls = EVALUATORS.resolve(ev.get("type"), f"{where}.eval_cfg.evaluator")
        check_kwargs(ev_cls, {k: v for k, v in ev.items() if k != "type"}, f"{where}.eval_cfg.evaluator")
    resolved = {**cfg, "type": f"{cls.__module__}.{cls.__qualname__}"}
    path = cfg.get("path")
    if isinstance(path, str) and path and not os.path.isabs(path):
        # Relative data paths: from where orchestra runs (as OpenCompass users expect), else
        # from the config file's folder or a folder above it (so `configs/data/x.jsonl` is
        # found from anywhere).  Made absolute once, so tasks never depend on a cwd.
        ancestors, folder = [], config_dir
        while folder and folder not in ancestors:
            ancestors.append(folder)
            folder = os.path.dirname(folder)
        for candidate in (path, *(os.path.join(a, path) for a in ancestors)):
            if os.path.exists(candidate):
                resolved["path"] = os.path.abspath(candidate)
                break
    return resolved


def _check_stage(name: str, cfg: Any, source: str) -> StageConfig:
    where = f"{source}: {name}"
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a dict with {', '.join(STAGE_KEYS)}, got {cfg!r}")
    for key in cfg:
        if key not in STAGE_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys: {', '.join(STAGE_KEYS)}")
    part_cfg = cfg.get("partitioner") or DEFAULT_STAGES[name]["partitioner"]
    partitioner = _build(PARTITIONERS, part_cfg, f"{where}.partitioner")
    runner_cfg = dict(cfg.get("runner") or DEFAULT_STAGES[name]["runner"])
    if "type" not in runner_cfg:
        raise ConfigError(f"{where}.runner: missing required key 'type'; valid: {', '.join(RUNNERS.names())}")
    runner_cls = RUNNERS.resolve(runner_cfg.pop("type"), f"{where}.runner")
    task_cfg = runner_cfg.pop("task", None) or DEFAULT_STAGES[name]["runner"]["task"]
    if not isinstance(task_cfg, dict) or "type" not in task_cfg:
        raise ConfigError(f"{where}.runner.task: expected dict(type=InferTask|EvalTask), got {task_cfg!r}")
    task_cls = TASKS.resolve(task_cfg["type"], f"{where}.runner.task")
    if getattr(task_cls, "stage", None) != name:
        raise ConfigError(
            f"{where}.runner.task: {task_cls.__name__} runs the {getattr(task_cls, 'stage', '?')} stage, not {name}"
        )
    task_kwargs = {k: v for k, v in task_cfg.items() if k != "type"}
    check_kwargs(task_cls, task_kwargs, f"{where}.runner.task")
    try:
        task_cls(**task_kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}.runner.task: {exc}") from None
    check_kwargs(runner_cls, runner_cfg, f"{where}.runner")
    template = runner_cfg.get("template")
    if template is not None:
        from orchestra.runners.command import fill_template

        fields = getattr(runner_cls, "template_fields", ())
        try:
            fill_template(template, ["true"], {k: "" for k in fields})
        except ConfigError as exc:
            raise ConfigError(f"{where}.runner.template: {exc}") from None
    return StageConfig(name, partitioner, runner_cls, runner_cfg, task_kwargs)


def validate(raw: dict[str, Any], source: str) -> RunConfig:
    """Check a loaded config; return it with partitioners built and types resolved."""
    for key, value in raw.items():
        if key in TOP_LEVEL_KEYS or key.startswith("_"):
            continue
        # Lists pulled in with read_base() (``arc_easy_datasets``) are fine to keep around.
        if isinstance(value, list) and key.endswith(("_datasets", "_models")):
            continue
        raise ConfigError(
            f"{source}: unknown top-level key {key!r}; valid keys: {', '.join(TOP_LEVEL_KEYS)} "
            "(and lists named *_datasets or *_models)"
        )
    _check_secrets(raw, source, top=True)
    for key in ("models", "datasets"):
        if key not in raw:
            raise ConfigError(f"{source}: missing required key {key!r}")
        if not isinstance(raw[key], list) or not raw[key]:
            raise ConfigError(f"{source}: {key} must be a non-empty list, got {raw[key]!r}")
    models = [_check_model(m, f"{source}: models[{i}]") for i, m in enumerate(raw["models"])]
    config_dir = os.path.dirname(os.path.abspath(source))
    datasets = [_check_dataset(d, f"{source}: datasets[{i}]", config_dir) for i, d in enumerate(raw["datasets"])]
    for kind, items in (("models", models), ("datasets", datasets)):
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            abbr = item.get("abbr")
            if not isinstance(abbr, str) or not abbr:
                raise ConfigError(f"{source}: {kind}[{i}]: missing required key 'abbr'")
            if abbr in seen:
                raise ConfigError(f"{source}: {kind}[{i}].abbr {abbr!r} is also used by {kind}[{seen[abbr]}]")
            seen[abbr] = i
    work_dir = raw.get("work_dir", "outputs/default")
    if not isinstance(work_dir, str) or not work_dir:
        raise ConfigError(f"{source}: work_dir must be a path string, got {work_dir!r}")
    stages = {name: _check_stage(name, raw.get(name), source) for name in ("infer", "eval")}
    abbrs = [d["abbr"] for d in datasets]
    for name, stage in stages.items():
        for abbr in getattr(stage.partitioner, "dataset_coef", {}):
            if abbr not in abbrs:
                raise ConfigError(
                    f"{source}: {name}.partitioner.dataset_coef: no dataset has abbr {abbr!r}; "
                    f"datasets: {', '.join(abbrs)}"
                )
    resolved = {
        "models": models,
        "datasets": datasets,
        "infer": raw.get("infer") or DEFAULT_STAGES["infer"],
        "eval": raw.get("eval") or DEFAULT_STAGES["eval"],
        "work_dir": work_dir,
    }
    return RunConfig(source, models, datasets, stages, work_dir, resolved)


def redact(obj: Any) -> Any:
    """A copy with secret-looking values replaced (defence in depth for dumps and logs)."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if SECRET_KEY.search(str(k)) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def dump_config(resolved: dict[str, Any], path: str) -> None:
    """Save the resolved config as a readable Python file in the run folder."""
    from orchestra.fileio import atomic_write_text

    parts = ["# Resolved config of this run, written by orchestra. Secrets are never written.\n"]
    for key, value in redact(to_plain(resolved)).items():
        parts.append(f"{key} = {pprint.pformat(value, width=100, sort_dicts=False)}\n")
    atomic_write_text(path, "\n".join(parts))
