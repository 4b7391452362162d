"""Turn a validated config into the tasks of both stages.

Content hashes are computed here: a prediction's hash covers the model settings that can
change an output, the dataset's reader and prompt settings, the data file's content key and
the shard's row range; a result's hash covers the hashes of all the predictions it scores
and the evaluator settings (for a judge: its model's identity and its resolved prompt;
see :func:`orchestra.evaluators.evaluator_identity`).  Units whose outputs already carry their hash are not planned.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestra.config import RunConfig
from orchestra.datasets.info import DatasetInfo
from orchestra.evaluators import evaluator_identity, evaluator_resources
from orchestra.fileio import stable_hash, temp_target, writers_lock
from orchestra.gcpause import gc_paused
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
    #: what the writing of reused outputs left when its writer was killed (a checkpoint and its
    #: lock once the output was sealed, a temporary file of an atomic write): nobody writes them again
    leftovers: list[str] = field(default_factory=list)


def model_class(model: dict[str, Any]) -> type[BaseModel]:
    """The class of a validated model config (its ``type`` is a dotted path)."""
    cls = MODELS.resolve(model["type"], f"model {model.get('abbr')}")
    assert issubclass(cls, BaseModel)
    return cls


#: part of the prediction hash of a dataset with few-shot examples: until this mark, they were
#: the rows' prompts without their answers, so predictions made then are never reused by ``-r``
FEWSHOT_FORMAT = "fewshot: prompt and answer"


def dataset_key(info: DatasetInfo) -> str:
    """The dataset's part of a prediction hash: its settings but its name and scoring, and its content."""
    cfg = {k: v for k, v in info.cfg.items() if k not in ("abbr", "eval_cfg")}
    if (cfg.get("infer_cfg") or {}).get("fewshot"):
        return stable_hash([cfg, info.content_key, FEWSHOT_FORMAT])
    return stable_hash([cfg, info.content_key])


def _hash_of_json(blob: str) -> str:
    """:func:`stable_hash` of an object whose JSON text is ``blob`` (built by the caller from
    parts encoded once, so that 100,000 units do not encode the same model key again)."""
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _json(obj: Any) -> str:
    """The JSON :func:`stable_hash` encodes ``obj`` to (a list's items join with ``', '``)."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)


def _task_id(stage: str, model_name: str, units: tuple[Unit, ...], names: dict[str, str]) -> str:
    """``<stage>_<model>_<first unit>[+<more>]``, file-safe; ``names`` remembers safe unit names."""
    first = units[0].name
    safe = names.get(first)
    if safe is None:
        safe = names[first] = safe_name(first)
    more = f"+{len(units) - 1}" if len(units) > 1 else ""
    return f"{stage}_{model_name}_{safe}{more}"


@dataclass
class _DatasetPlan:
    """What planning needs of one dataset, the same for every model: worked out once."""

    info: DatasetInfo
    key_json: str  # JSON of the dataset's part of a prediction hash
    shards: list[tuple[int, int]]
    row_cost: float
    eval_json: str  # JSON of the evaluator settings a result's hash covers
    eval_needs: dict[str, int]  # what scoring it occupies (num_gpus, num_procs)
    safe: str  # file-safe abbr


def _dataset_plans(infos: list[DatasetInfo], infer: BasePartitioner) -> list[_DatasetPlan]:
    out = []
    for info in infos:
        eval_cfg = info.cfg.get("eval_cfg") or {}
        needs = evaluator_resources(eval_cfg)
        out.append(_DatasetPlan(info, _json(dataset_key(info)), infer.split(info), infer.row_cost(info),
                                _json(evaluator_identity(info.cfg.get("eval_cfg") or {})),
                                {k: needs[k] for k in ("num_gpus", "num_procs")}, safe_name(info.abbr)))
    return out


def _eval_needs(units: Sequence[Unit], needs: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
    """What an eval task of ``units`` occupies: the most any of their evaluators needs
    (``needs``: each dataset's, by abbr, worked out once; else asked of each evaluator)."""
    if needs is None:
        every = [evaluator_resources(u.dataset.get("eval_cfg") or {}) for u in units]
    elif len(units) == 1:
        return needs[units[0].dataset_abbr]
    else:
        every = [needs[u.dataset_abbr] for u in units]
    return {key: max(n[key] for n in every) for key in ("num_gpus", "num_procs")}


def _pack(
    stage: str,
    partitioner: BasePartitioner,
    model: dict[str, Any],
    units: list[Unit],
    paths: RunPaths,
    task_cfg: dict[str, Any],
    eval_needs: dict[str, dict[str, int]],
    names: dict[str, str],
) -> list[TaskSpec]:
    cls = model_class(model)
    # A warm worker that ran an infer task keeps its model for the next task with this key.
    worker_key = f"infer|{cls.instance_key(model)}" if stage == "infer" else "eval"
    model_needs = cls.resources(model)
    model_name = safe_name(model["abbr"])
    abbr, root, make = model["abbr"], paths.root, TaskSpec.make
    tasks = []
    infer = stage == "infer"
    for group in partitioner.pack([u.cost for u in units]):
        chosen = tuple([units[i] for i in group])
        needs = model_needs if infer else _eval_needs(chosen, eval_needs)
        tasks.append(make(stage, _task_id(stage, model_name, chosen, names), root, model, abbr, chosen, task_cfg,
                          needs["num_gpus"], needs["num_procs"], worker_key))
    return tasks


def make_plan(cfg: RunConfig, infos: list[DatasetInfo], paths: RunPaths) -> Plan:
    """Plan both stages; units already done in ``paths`` are reused, not planned.

    Linear in models x datasets: what depends on a dataset alone (its key, shards, evaluator)
    is worked out once, and an output is only opened when its folder exists.  The cyclic
    garbage collector is paused meanwhile: the plan makes no cycles, and at 100,000 tasks its
    full passes over the growing plan took a third of the time.
    """
    with gc_paused():
        return _make_plan(cfg, infos, paths)


def _make_plan(cfg: RunConfig, infos: list[DatasetInfo], paths: RunPaths) -> Plan:
    infer_stage, eval_stage = cfg.stages["infer"], cfg.stages["eval"]
    plan = Plan(tasks={"infer": [], "eval": []}, reused={"infer": [], "eval": []},
                all_units={"infer": [], "eval": []})
    # (prediction hash, base model, base dataset) -> the unit that makes it.  Only variants of one
    # sweep base share: two models a user listed apart (repeated sampling runs, say) never do.
    makers: dict[tuple[str, str, str], Unit] = {}
    bases = cfg.sweep.variants if cfg.sweep is not None else {}

    def base(kind: str, abbr: str) -> str:
        return str(bases.get(kind, {}).get(abbr, {}).get("base", abbr))

    datasets = _dataset_plans(infos, infer_stage.partitioner)
    eval_needs = {d.info.abbr: d.eval_needs for d in datasets}
    dataset_bases = [base("datasets", d.info.abbr) for d in datasets]
    existing = _existing_outputs(paths)
    temps: dict[str, list[str]] = {}  # target -> the temporary files of its killed writes
    for path in existing:
        target = temp_target(path)
        if target is not None:
            temps.setdefault(target, []).append(path)
    names: dict[str, str] = {}  # unit name -> its file-safe form, for task ids
    new_unit = Unit.make
    all_infer, all_eval = plan.all_units["infer"], plan.all_units["eval"]
    for model in cfg.models:
        abbr = model["abbr"]
        model_json = _json(model_class(model).identity(model))
        model_base = base("models", abbr)
        pred_dir = os.path.dirname(paths.predictions(abbr, "x", None)) + os.sep
        result_dir = os.path.dirname(paths.results(abbr, "x")) + os.sep
        check = bool(existing)  # a new run folder: every unit is to do, none is looked up
        todo: dict[str, list[Unit]] = {"infer": [], "eval": []}
        own_infer = todo["infer"] if not check else []
        own_eval = todo["eval"] if not check else []
        for ds, ds_base in zip(datasets, dataset_bases):
            info = ds.info
            prefix = f"[{model_json}, {ds.key_json}, "
            shard_units = []
            num_shards = len(ds.shards)
            for i, (start, end) in enumerate(ds.shards):
                index = i if num_shards > 1 else None
                unit = new_unit(info.cfg, info.abbr, start, end, index, num_shards,
                                f"{pred_dir}{ds.safe}.jsonl" if index is None else f"{pred_dir}{ds.safe}_{index}.jsonl",
                                _hash_of_json(f"{prefix}{start}, {end}]"), (end - start) * ds.row_cost)
                first = makers.setdefault((unit.hash, model_base, ds_base), unit) if bases else unit
                if first is not unit:  # same predictions as another variant: made once, read by both
                    plan.shared.append((abbr, unit, first.output))
                else:
                    all_infer.append((abbr, unit))
                    own_infer.append(unit)
                shard_units.append(first)
            hashes = ", ".join([f'"{u.hash}"' for u in shard_units])  # hex: their JSON needs no escaping
            eval_unit = new_unit(info.cfg, info.abbr, 0, info.size, None, 1, f"{result_dir}{ds.safe}.json",
                                 _hash_of_json(f"[[{hashes}], {ds.eval_json}]"), float(info.size),
                                 tuple((u.output, u.hash) for u in shard_units))
            all_eval.append((abbr, eval_unit))
            own_eval.append(eval_unit)
        if check:
            for stage, own in (("infer", own_infer), ("eval", own_eval)):
                for unit in own:
                    if unit.output in existing and output_done(unit.output, unit.hash):
                        plan.reused[stage].append(unit)
                        plan.leftovers += _leftovers(stage, unit, paths, existing, temps)
                    else:
                        todo[stage].append(unit)
        for stage, st in (("infer", infer_stage), ("eval", eval_stage)):
            if todo[stage]:
                plan.tasks[stage] += _pack(stage, st.partitioner, model, todo[stage], paths, st.task_cfg, eval_needs,
                                           names)
    return plan


def _leftovers(stage: str, unit: Unit, paths: RunPaths, existing: set[str], temps: dict[str, list[str]]
               ) -> list[str]:
    """What the writing of the finished output of ``unit`` left when its writer was killed."""
    if stage == "infer":  # killed after sealing, before dropping the checkpoint
        ckpt = paths.checkpoint(unit.output)
        found = [p for p in (ckpt, ckpt + ".lock") if p in existing]
        return found + temps.get(unit.output, [])
    details = unit.output[: -len(".json")] + ".details.jsonl"  # RunPaths.details beside RunPaths.results
    return temps.get(unit.output, []) + temps.get(details, [])


#: the temporary file of a task spec (``TaskSpec.dump``) or of an atomic write
_ORCHESTRATOR_TEMP = re.compile(r"(.+\.tmp-\d+-\d+|\.tmp-[0-9a-f]{8}.+)")


def clear_leftovers(plan: Plan, paths: RunPaths) -> list[str]:
    """Remove what killed writers left in the run folder before any task starts: ``plan.leftovers``
    (of outputs finished already) and the temporary files of the folders that only the
    orchestrator writes (task specs, the summary).  For the orchestrator that holds the run
    folder's lock; returns the removed paths."""
    removed = _unlink(list(plan.leftovers) + _temps(os.path.dirname(paths.task_spec("x"))))
    if os.path.isdir(paths.summary_dir):
        with writers_lock(paths.summary_lock, exclusive=True) as alone:
            if alone:  # else a --mode viz (no run lock) is writing: its temporary files are live
                removed += _unlink(_temps(paths.summary_dir))
    return removed


def _temps(folder: str) -> list[str]:
    """The temporary files in ``folder`` (none if it is missing)."""
    try:
        return [os.path.join(folder, n) for n in os.listdir(folder) if _ORCHESTRATOR_TEMP.fullmatch(n)]
    except FileNotFoundError:
        return []


def _unlink(paths: list[str]) -> list[str]:
    """Remove ``paths``; those removed (one already gone is skipped)."""
    removed = []
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def _existing_outputs(paths: RunPaths) -> set[str]:
    """Every file under the run folder's predictions and results (one listing, not a stat per unit)."""
    found: set[str] = set()
    for top in (os.path.dirname(os.path.dirname(paths.predictions("m", "x", None))),
                os.path.dirname(os.path.dirname(paths.results("m", "x")))):
        for folder, _, files in os.walk(top):
            found.update(os.path.join(folder, f) for f in files)
    return found
