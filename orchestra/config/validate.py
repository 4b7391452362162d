"""Validate a loaded config: everything a user can get wrong, before anything runs.

Each problem is one ``ConfigError`` line naming the file and the key.  Classes named by
``type`` are resolved through the registries and their keys checked against their
constructors; models whose constructor is cheap are built once to check their values
(``validate_by_construction``); others are only checked, never built (building may load weights).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from orchestra.config.chatcheck import check_chat_templates
from orchestra.config.relpaths import found as found_path
from orchestra.config.schema import build_component, check_kwargs
from orchestra.config.secrets import check_secrets
from orchestra.config.statkeys import check_cluster_key, check_summarizer
from orchestra.config.sweep import SweepInfo, expand_sweep
from orchestra.datasets.base import BaseDataset
from orchestra.errors import ConfigError, check_known_keys
from orchestra.inferencers import get_inferencer, inferencer_cfg
from orchestra.models.base import BaseModel
from orchestra.paths import safe_name, shard_file_stem
from orchestra.registry import DATASETS, EVALUATORS, MODELS, PARTITIONERS, RUNNERS, TASKS


class _ChecksTemplate(Protocol):
    """What of a runner class the config check calls (``BaseRunner.check_template``; the config
    layer does not import the runners)."""

    @classmethod
    def check_template(cls, template: str | list[str]) -> None: ...

# (``prices`` is taken out by orchestra.api before validation; it is here for the error message)
TOP_LEVEL_KEYS = ("models", "datasets", "infer", "eval", "work_dir", "sweep", "prices", "summarizer")
STAGE_KEYS = ("partitioner", "runner")
RUN_CFG_KEYS = ("num_gpus", "num_procs")
# Keys of a dataset's sub-configs; a dataset class may widen them with class attributes of
# the same names in lower case (``reader_cfg_keys = (...)``).
READER_CFG_KEYS = ("input_columns", "output_column", "test_range")
INFER_CFG_KEYS = ("prompt_template", "inferencer", "fewshot", "fewshot_template")
EVAL_CFG_KEYS = ("evaluator", "cluster_key")
FEWSHOT_KEYS = ("k", "source", "separator")
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
    #: eval only: a (model, dataset)'s eval starts as soon as its predictions are done, while
    #: other inference still runs (False: after the whole infer stage)
    overlap: bool = True


@dataclass
class RunConfig:
    """A validated config, ready to plan and run."""

    source: str
    models: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    stages: dict[str, StageConfig]
    work_dir: str
    resolved: dict[str, Any] = field(default_factory=dict)
    sweep: SweepInfo | None = None  # what a sweep expanded to (None: no sweep)
    summarizer: dict[str, Any] = field(default_factory=dict)  # checked ``summarizer`` (config/statkeys.py)





def _check_model(cfg: Any, where: str) -> dict[str, Any]:
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise ConfigError(f"{where}: a model is a dict with 'type' and 'abbr', got {cfg!r}")
    cls = MODELS.resolve(cfg["type"], where)
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    check_kwargs(cls, kwargs, where, extra=("run_cfg",))
    run_cfg = cfg.get("run_cfg", {})
    if not isinstance(run_cfg, dict):
        raise ConfigError(f"{where}.run_cfg: expected a dict with {', '.join(RUN_CFG_KEYS)}")
    check_known_keys(run_cfg, RUN_CFG_KEYS, f"{where}.run_cfg")
    for key, value in run_cfg.items():
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


def _check_served(models: list[dict[str, Any]], datasets: list[dict[str, Any]], source: str) -> None:
    """A managed server whose engine returns no prompt log-probs cannot score a loglik dataset:
    a native one (``inferencer=dict(type='loglik')``) or one whose class says it needs log-probs
    (``needs_loglik(cfg)``, e.g. an lm-eval ``multiple_choice`` task), asked only then."""
    from orchestra.serving.spec import parse_server

    _check_served_names(models, datasets, source)
    blind = [(i, parse_server(m["server"])) for i, m in enumerate(models) if m.get("server")]
    blind = [(i, spec) for i, spec in blind if not spec.supports_loglik]
    if not blind:
        return
    i, spec = blind[0]
    for d in datasets:
        what = None
        if ((d.get("infer_cfg") or {}).get("inferencer") or {}).get("type") == "loglik":
            what = f"log-likelihood dataset {d['abbr']!r}"
        else:
            needs = getattr(DATASETS.resolve(d["type"], f"{source}: datasets"), "needs_loglik", None)
            found = needs(d) if callable(needs) else None
            what = f"{found} of dataset {d['abbr']!r}" if found else None
        if what:
            raise ConfigError(
                f"{source}: models[{i}].server.engine {spec.engine!r} returns no prompt log-probs, so it cannot "
                f"score {what}; use engine 'vllm' or 'sglang', or a local model")


def check_greedy(models: list[dict[str, Any]], datasets: list[dict[str, Any]], source: str) -> None:
    """A model that cannot report ``is_greedy`` (``reports_greedy``) cannot answer a dataset whose
    metric reads it (an lm-eval ``output_type: loglikelihood`` task); asked only for such models,
    after the planner's dataset facts (an lm-eval dataset's output types come with its manifest)."""
    classes = [MODELS.resolve(m["type"], f"{source}: models") for m in models]
    blind = [i for i, (cls, m) in enumerate(zip(classes, models)) if issubclass(cls, BaseModel)
             and not cls.reports_greedy(m)]
    if not blind:
        return
    for j, d in enumerate(datasets):
        cls = DATASETS.resolve(d["type"], f"{source}: datasets")
        try:
            found = cls.needs_greedy(d) if issubclass(cls, BaseDataset) else None
        except ConfigError as exc:
            raise ConfigError(f"{source}: datasets[{j}] ({d['abbr']}): {exc}") from None
        if found:
            i = blind[0]
            raise ConfigError(f"{source}: models[{i}] ({models[i]['abbr']!r}, {models[i]['type'].rsplit('.', 1)[-1]}) "
                              f"cannot report is_greedy, which {found} of datasets[{j}] ({d['abbr']!r}) needs; "
                              "use HFCausalLM or OpenAIAPI(endpoint='completions')")


def _check_served_names(models: list[dict[str, Any]], datasets: list[dict[str, Any]], source: str) -> None:
    """Served models share one replica set per abbr and stage (``servers/<abbr>/``): judges of
    one abbr must be the same server serving the same name, and no judge may take the abbr of a
    served infer model (the eval stage runs its own replicas, with its own key, while infer tasks
    of that model may still run)."""
    from orchestra.serving.spec import served_judge

    infer = {str(m["abbr"]) for m in models if m.get("server")}
    seen: dict[str, tuple[str, Any]] = {}
    for j, d in enumerate(datasets):
        judge = served_judge(d)
        if judge is None:
            continue
        abbr, mine = str(judge.get("abbr") or "judge"), (str(judge.get("path")), judge["server"])
        where = f"{source}: datasets[{j}].eval_cfg.evaluator.judge: abbr {abbr!r}"
        if abbr in infer:
            raise ConfigError(f"{where} is a served model of the infer stage: the eval stage would start its own "
                              f"replicas of it in the same folder servers/{abbr}/; give this judge its own abbr")
        if seen.setdefault(abbr, mine) != mine:
            raise ConfigError(f"{where} names another served judge (another server or path) of this config; "
                              "give this judge its own abbr")


def _check_keys(sub: dict[str, Any], valid: tuple[str, ...], where: str) -> None:
    check_known_keys(sub, sorted(valid), where)


def _check_dataset(cfg: Any, where: str, config_dir: str = "") -> dict[str, Any]:
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise ConfigError(f"{where}: a dataset is a dict with 'type', 'abbr', 'path', got {cfg!r}")
    cls = DATASETS.resolve(cfg["type"], where)
    if "abbr" not in cfg and issubclass(cls, BaseDataset) and (abbr := cls.default_abbr(cfg)):
        cfg = {**cfg, "abbr": abbr}
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
    for key in ("prompt_template", "fewshot_template"):
        tmpl = infer_cfg.get(key)
        chat = isinstance(tmpl, (list, tuple)) and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str) for m in tmpl)
        if tmpl is not None and not isinstance(tmpl, str) and not chat:
            raise ConfigError(f"{where}.infer_cfg.{key}: expected a string such as 'Q: {{question}}' or a list of "
                              f"dict(role=..., content=...) messages, got {tmpl!r}")
    raw_inf = infer_cfg.get("inferencer")
    if raw_inf is not None and not isinstance(raw_inf, (dict, str)):
        raise ConfigError(f"{where}.infer_cfg.inferencer: expected a dict such as dict(type='gen'), got {raw_inf!r}")
    inf = inferencer_cfg(raw_inf)
    kind = get_inferencer(inf.get("type", "gen"), f"{where}.infer_cfg.inferencer.type")
    kind.check(inf, f"{where}.infer_cfg.inferencer")
    check_cluster_key(cfg, getattr(cls, "score", None) is not BaseDataset.score, where)
    evaluator = (cfg.get("eval_cfg") or {}).get("evaluator")
    resolved = {**cfg, "type": f"{cls.__module__}.{cls.__qualname__}"}
    if evaluator is not None:
        ev = dict(evaluator) if isinstance(evaluator, dict) else {"type": evaluator}
        ev_where = f"{where}.eval_cfg.evaluator"
        ev_cls = EVALUATORS.resolve(ev.get("type"), ev_where)
        check_kwargs(ev_cls, {k: v for k, v in ev.items() if k != "type"}, ev_where)
        # Keys that hold a model (a judge) are checked as models are, and resolved the same way.
        model_keys = [key for key in getattr(ev_cls, "model_keys", ()) if key in ev]
        for key in model_keys:
            ev[key] = _check_model({"abbr": key, **ev[key]} if isinstance(ev[key], dict) else ev[key],
                                   f"{ev_where}.{key}")
        check = getattr(ev_cls, "check_config", None)
        if callable(check):
            check(ev, cfg, ev_where)
        if model_keys:
            resolved["eval_cfg"] = {**cfg["eval_cfg"], "evaluator": ev}
    for key in getattr(cls, "path_keys", ("path",)):  # `path`, an lm-eval task's `include_path`
        value = cfg.get(key)
        if isinstance(value, str):
            resolved[key] = found_path(value, config_dir)
        elif isinstance(value, (list, tuple)):
            resolved[key] = [found_path(v, config_dir) if isinstance(v, str) else v for v in value]
    return resolved


def _check_file_names(datasets: list[dict[str, Any]], source: str) -> None:
    """Reject a dataset whose files would be taken for another dataset's shard files
    (``arith_1.jsonl`` is dataset ``arith_1``, or shard 1 of ``arith``)."""
    index = {safe_name(d["abbr"]): i for i, d in enumerate(datasets)}
    for name, i in index.items():
        split = shard_file_stem(name)
        if split and split[0] in index:
            j = index[split[0]]
            raise ConfigError(
                f"{source}: datasets[{i}].abbr {datasets[i]['abbr']!r} would share file names with the shards of "
                f"datasets[{j}].abbr {datasets[j]['abbr']!r}; rename one (e.g. without the '_<number>' ending)"
            )


def _check_tolerance(infer: StageConfig, datasets: list[dict[str, Any]], source: str) -> None:
    """``error_tolerance`` keeps failed samples for the eval task: each dataset must score them."""
    tolerance = infer.task_cfg.get("error_tolerance", 0)
    for i, d in enumerate(datasets if tolerance else ()):
        cls = DATASETS.resolve(d["type"], f"{source}: datasets[{i}]")
        if not getattr(cls, "scores_failed_samples", True):
            raise ConfigError(
                f"{source}: infer.runner.task.error_tolerance={tolerance!r}: datasets[{i}] ({d['abbr']!r}) is an "
                f"{cls.__name__}, whose metrics cannot score a sample that failed in inference; use "
                "error_tolerance=0 (the infer task's retry re-sends failed samples)")


def _with_default_type(cfg: Any, default: dict[str, Any]) -> Any:
    """``cfg`` (a partitioner's, runner's or task's dict) with the stage default's ``type`` when it names none."""
    if not cfg:
        return default
    if isinstance(cfg, dict) and "type" not in cfg:
        return {**default, **cfg}
    return cfg


def _check_stage(name: str, cfg: Any, source: str) -> StageConfig:
    where = f"{source}: {name}"
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a dict with {', '.join(STAGE_KEYS)}, got {cfg!r}")
    valid = (*STAGE_KEYS, "overlap") if name == "eval" else STAGE_KEYS
    check_known_keys(cfg, valid, where)
    overlap = cfg.get("overlap", True)
    if not isinstance(overlap, bool):
        raise ConfigError(f"{where}.overlap: expected True or False, got {overlap!r}")
    # A partitioner or runner given without a type is the stage's default one with these settings
    # (``--cfg-options infer.runner.max_num_workers=4`` on a config that names no runner); its keys
    # are checked against that class, so a key of another runner still names what is valid.
    part_cfg = _with_default_type(cfg.get("partitioner"), DEFAULT_STAGES[name]["partitioner"])
    partitioner = build_component(PARTITIONERS, part_cfg, f"{where}.partitioner")
    runner_cfg = dict(_with_default_type(cfg.get("runner"), DEFAULT_STAGES[name]["runner"]))
    if not runner_cfg.get("type"):
        raise ConfigError(f"{where}.runner: missing required key 'type'; valid: {', '.join(RUNNERS.names())}")
    runner_cls = RUNNERS.resolve(runner_cfg.pop("type"), f"{where}.runner")
    # the same for the runner's task: ``infer.runner.task.max_samples=8`` is the stage's own task
    task_cfg = _with_default_type(runner_cfg.pop("task", None), DEFAULT_STAGES[name]["runner"]["task"])
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
    if template is not None:  # RUNNERS resolves only classes that derive from BaseRunner
        try:
            cast(type[_ChecksTemplate], runner_cls).check_template(template)
        except ConfigError as exc:
            raise ConfigError(f"{where}.runner.template: {exc}") from None
    return StageConfig(name, partitioner, runner_cls, runner_cfg, task_kwargs, overlap)


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
    check_secrets(raw, source)
    sweep = expand_sweep(raw, source)
    for key in ("models", "datasets"):
        if key not in raw:
            raise ConfigError(f"{source}: missing required key {key!r}")
        if not isinstance(raw[key], list) or not raw[key]:
            raise ConfigError(f"{source}: {key} must be a non-empty list, got {raw[key]!r}")
    def where(kind: str, i: int, item: Any) -> str:
        abbr = item.get("abbr") if isinstance(item, dict) else None
        swept = sweep is not None and abbr in sweep.variants.get(kind, {})
        return f"{source}: {kind}[{i}]" + (f" (sweep variant {abbr!r})" if swept else "")

    models = [_check_model(m, where("models", i, m)) for i, m in enumerate(raw["models"])]
    config_dir = os.path.dirname(os.path.abspath(source))
    datasets = [_check_dataset(d, where("datasets", i, d), config_dir) for i, d in enumerate(raw["datasets"])]
    for kind, items in (("models", models), ("datasets", datasets)):
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            abbr = item.get("abbr")
            if not isinstance(abbr, str) or not abbr:
                raise ConfigError(f"{source}: {kind}[{i}]: missing required key 'abbr'")
            if abbr in seen:
                raise ConfigError(f"{source}: {kind}[{i}].abbr {abbr!r} is also used by {kind}[{seen[abbr]}]")
            seen[abbr] = i
    _check_file_names(datasets, source)
    _check_served(models, datasets, source)
    check_chat_templates(models, datasets, source)
    work_dir = raw.get("work_dir", "outputs/default")
    if not isinstance(work_dir, str) or not work_dir:
        raise ConfigError(f"{source}: work_dir must be a path string, got {work_dir!r}")
    stages = {name: _check_stage(name, raw.get(name), source) for name in ("infer", "eval")}
    _check_tolerance(stages["infer"], datasets, source)
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
    if sweep is not None:
        resolved["sweep"] = sweep.to_dict()
    summarizer = check_summarizer(raw.get("summarizer"), [m["abbr"] for m in models], source)
    if summarizer:
        resolved["summarizer"] = summarizer
    return RunConfig(source, models, datasets, stages, work_dir, resolved, sweep, summarizer)


