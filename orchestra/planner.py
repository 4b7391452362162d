"""Turn a validated config into the tasks of both stages.

Content hashes are computed here: a prediction's hash covers the model settings that can
change an output, the dataset's reader and prompt settings, the data file's content key and
the shard's row range; a result's hash covers the hashes of all the predictions it scores
and the evaluator settings (for a judge: its model's identity and its resolved prompt;
see :func:`orchestra.evaluators.evaluator_identity`).  Units whose outputs already carry their hash are not planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestra.config import RunConfig
from orchestra.datasets.info import DatasetInfo
from orchestra.evaluators import evaluator_identity, evaluator_resources
from orchestra.fileio import stable_hash
from orchestra.models.base import BaseModel
from orchestra.partitioners.base import BasePartitioner
from orchestra.paths import RunPaths, safe_name
from orchestra.registry import MODELS
from orchestra.tasks.spec import TaskSpec, Unit, output_done


@dataclass
class Plan:
    """The tasks still to run in each stage, and the outputs reused from earlier runs."""

    tasks: dict[str, list[TaskSpec]]
    reused: dict[str, list[Unit]] = field(default_factory=dict)
    all_units: dict[str, list[tuple[str, Unit]]] = field(default_factory=dict)  # (model, unit)
    #: infer units another unit with the same hash already makes (sweep variants whose
    #: predictions cannot differ): (model abbr, unit, the output they share)
    shared: list[tuple[str, Unit, str]] = field(default_factory=list)


def model_class(model: dict[str, Any]) -> type[BaseModel]:
    """The class of a validated model config (its ``type`` is a dotted path)."""
    cls = MODELS.resolve(model["type"], f"model {model.get('abbr')}")
    assert issubclass(cls, BaseModel)
    return cls


def dataset_key(info: DatasetInfo) -> str:
    cfg = {k: v for k, v in info.cfg.items() if k not in ("abbr", "eval_cfg")}
    return stable_hash([cfg, info.content_key])


def _task_id(stage: str, model_abbr: str, units: list[Unit]) -> str:
    more = f"+{len(units) - 1}" if len(units) > 1 else ""
    return f"{stage}_{safe_name(model_abbr)}_{safe_name(units[0].name)}{more}"


def _eval_needs(units: list[Unit]) -> dict[str, int]:
    """What an eval task of ``units`` occupies: the most any of their evaluators needs."""
    every = [evaluator_resources(u.dataset.get("eval_cfg") or {}) for u in units]
    return {key: max(n[key] for n in every) for key in ("num_gpus", "num_procs")}


def _pack(
    stage: str,
    partitioner: BasePartitioner,
    model: dict[str, Any],
    units: list[Unit],
    paths: RunPaths,
    task_cfg: dict[str, Any],
) -> list[TaskSpec]:
    cls = model_class(model)
    # A warm worker that ran an infer task keeps its model for the next task with this key.
    worker_key = f"infer|{cls.instance_key(model)}" if stage == "infer" else "eval"
    tasks = []
    for group in partitioner.pack([u.cost for u in units]):
        chosen = [units[i] for i in group]
        needs = cls.resources(model) if stage == "infer" else _eval_needs(chosen)
        tasks.append(
            TaskSpec(
                stage=stage,
                task_id=_task_id(stage, model["abbr"], chosen),
                run_dir=paths.root,
                model=model,
                model_abbr=model["abbr"],
                units=tuple(chosen),
                task_cfg=task_cfg,
                num_gpus=needs["num_gpus"],
                num_procs=needs["num_procs"],
                worker_key=worker_key,
            )
        )
    return tasks


def make_plan(cfg: RunConfig, infos: list[DatasetInfo], paths: RunPaths) -> Plan:
    """Plan both stages; units already done in ``paths`` are reused, not planned."""
    infer_stage, eval_stage = cfg.stages["infer"], cfg.stages["eval"]
    plan = Plan(tasks={"infer": [], "eval": []}, reused={"infer": [], "eval": []},
                all_units={"infer": [], "eval": []})
    # (prediction hash, base model, base dataset) -> the unit that makes it.  Only variants of one
    # sweep base share: two models a user listed apart (repeated sampling runs, say) never do.
    makers: dict[tuple[str, str, str], Unit] = {}
    bases = cfg.sweep.variants if cfg.sweep is not None else {}

    def base(kind: str, abbr: str) -> str:
        return str(bases.get(kind, {}).get(abbr, {}).get("base", abbr))

    for model in cfg.models:
        mkey = model_class(model).identity(model)
        todo: dict[str, list[Unit]] = {"infer": [], "eval": []}
        for info in infos:
            dkey = dataset_key(info)
            row_cost = infer_stage.partitioner.row_cost(info)
            shards = infer_stage.partitioner.split(info)
            shard_units = []
            for i, (start, end) in enumerate(shards):
                index = i if len(shards) > 1 else None
                shard_units.append(
                    Unit(
                        dataset=info.cfg,
                        dataset_abbr=info.abbr,
                        start=start,
                        end=end,
                        shard=index,
                        num_shards=len(shards),
                        output=paths.predictions(model["abbr"], info.abbr, index),
                        hash=stable_hash([mkey, dkey, start, end]),
                        cost=(end - start) * row_cost,
                    )
                )
            for n, unit in enumerate(shard_units):
                first = makers.setdefault((unit.hash, base("models", model["abbr"]), base("datasets", info.abbr)), unit)
                if first is not unit:  # same predictions as another variant: made once, read by both
                    plan.shared.append((model["abbr"], unit, first.output))
                    shard_units[n] = first
            eval_unit = Unit(
                dataset=info.cfg,
                dataset_abbr=info.abbr,
                start=0,
                end=info.size,
                shard=None,
                num_shards=1,
                output=paths.results(model["abbr"], info.abbr),
                hash=stable_hash([[u.hash for u in shard_units], evaluator_identity(info.cfg.get("eval_cfg", {}))]),
                cost=float(info.size),
                inputs=tuple((u.output, u.hash) for u in shard_units),
            )
            own = [u for u in shard_units if u.output == paths.predictions(model["abbr"], info.abbr, u.shard)]
            for stage, units in (("infer", own), ("eval", [eval_unit])):
                for unit in units:
                    plan.all_units[stage].append((model["abbr"], unit))
                    if output_done(unit.output, unit.hash):
                        plan.reused[stage].append(unit)
                    else:
                        todo[stage].append(unit)
        for stage, st in (("infer", infer_stage), ("eval", eval_stage)):
            if todo[stage]:
                plan.tasks[stage] += _pack(stage, st.partitioner, model, todo[stage], paths, st.task_cfg)
    return plan
