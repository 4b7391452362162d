"""Sweeps: a declared product of models, datasets and settings, expanded into named variants.

::

    sweep = dict(
        params={'models.generation_kwargs.temperature': [0, 0.7],
                'datasets.infer_cfg.prompt_template': {'plain': '{question}', 'cot': 'Think. {question}'}},
        baseline={'temperature': 0, 'prompt_template': 'plain'},   # optional: deltas against it
        max_variants=50,                                             # more needs --yes
    )

An axis is a dotted path: ``models.<key>[.<key>...]`` changes every model, ``datasets.<...>``
every dataset.  Its values are a list (each named ``<last key>=<value>``) or a dict of named
values.  The config's ``models`` and ``datasets`` (or ``sweep.models`` / ``sweep.datasets``)
are the bases; each base gets one variant per combination of its axes, with a readable abbr
(``smollm2[temperature=0.7]``, ``gsm8k[cot]``).  Variants are ordinary models and datasets:
each has its own content hash, so a variant whose predictions cannot differ (an axis that only
changes ``eval_cfg``, or a speed-only model setting) shares its predictions with the others.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from orchestra.config.secrets import check_secrets
from orchestra.errors import ConfigError, UserError, check_known_keys
from orchestra.secretnames import secret_key

SWEEP_KEYS = ("models", "datasets", "params", "baseline", "max_variants")
DEFAULT_MAX_VARIANTS = 50


@dataclass
class Axis:
    """One swept setting: where it goes and its named values."""

    path: str  # the full dotted path, e.g. 'models.generation_kwargs.temperature'
    kind: str  # 'models' | 'datasets'
    keys: tuple[str, ...]  # inside one model/dataset dict: ('generation_kwargs', 'temperature')
    values: dict[str, Any]  # label -> value

    @property
    def name(self) -> str:
        return self.keys[-1]


@dataclass
class SweepInfo:
    """What a run's sweep expanded to, for the summary's pivot and the dry run.

    ``variants[kind][abbr] = {"base": base abbr, "labels": {axis name: value label}}``.
    """

    axes: list[str] = field(default_factory=list)  # axis names, in order
    variants: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    baseline: dict[str, str] = field(default_factory=dict)
    max_variants: int = DEFAULT_MAX_VARIANTS
    num_models: int = 0  # models and datasets after expansion (variants and unswept ones)
    num_datasets: int = 0

    def count(self) -> int:
        """(model, dataset) pairs the sweep makes: what ``max_variants`` bounds."""
        return self.num_models * self.num_datasets

    def to_dict(self) -> dict[str, Any]:
        return {"expanded": True, "axes": self.axes, "variants": self.variants, "baseline": self.baseline,
                "max_variants": self.max_variants, "num_models": self.num_models, "num_datasets": self.num_datasets}


def _label(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _axes(params: Any, where: str) -> list[Axis]:
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{where}.params: expected a dict of 'models.<key>' / 'datasets.<key>' -> values, "
                          f"got {params!r}")
    axes = []
    for path, values in params.items():
        parts = tuple(str(path).split("."))
        if len(parts) < 2 or parts[0] not in ("models", "datasets") or not all(parts[1:]):
            raise ConfigError(f"{where}.params: axis {path!r} must start with 'models.' or 'datasets.' "
                              "followed by a key, e.g. 'models.generation_kwargs.temperature'")
        if any(secret_key(part) for part in parts[1:]):  # its values would be in every variant's abbr
            raise ConfigError(f"{where}.params: axis {path!r} sets a secret; secrets do not belong in a config (they "
                              "would name the variants, their files and tasks): put it in an environment variable "
                              "and give its name (e.g. key_env='OPENAI_API_KEY')")
        if isinstance(values, dict):
            named = {str(k): v for k, v in values.items()}
        elif isinstance(values, (list, tuple)):
            named = {f"{parts[-1]}={_label(v)}": v for v in values}
            if len(named) != len(values):
                raise ConfigError(f"{where}.params[{path!r}]: two values have the same name; give a dict of "
                                  "named values instead")
        else:
            raise ConfigError(f"{where}.params[{path!r}]: expected a list of values or a dict of named values, "
                              f"got {values!r}")
        if not named:
            raise ConfigError(f"{where}.params[{path!r}]: no values (the sweep would be empty)")
        axes.append(Axis(str(path), parts[0], parts[1:], named))
    names = [a.name for a in axes]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{where}.params: two axes end in {name!r}; labels would be ambiguous")
    return axes


def _set(item: dict[str, Any], keys: tuple[str, ...], value: Any, where: str) -> None:
    target = item
    for key in keys[:-1]:
        nxt = target.get(key)
        if nxt is None:
            nxt = target[key] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where}: cannot set {'.'.join(keys)}: {key!r} holds {nxt!r}, not a dict")
        target = nxt
    target[keys[-1]] = copy.deepcopy(value)


def _expand(kind: str, bases: list[Any], axes: list[Axis], where: str,
            variants: dict[str, dict[str, Any]]) -> list[Any]:
    mine = [a for a in axes if a.kind == kind]
    if not mine:
        return bases
    out = []
    for i, base in enumerate(bases):
        if not isinstance(base, dict) or not isinstance(base.get("abbr"), str):
            raise ConfigError(f"{where}: {kind}[{i}] needs an 'abbr' to name its variants")
        for combo in itertools.product(*(a.values.items() for a in mine)):
            item = copy.deepcopy(base)
            for axis, (_, value) in zip(mine, combo):
                _set(item, axis.keys, value, f"{where}: axis {axis.path!r} on {kind}[{i}]")
            labels = {axis.name: label for axis, (label, _) in zip(mine, combo)}
            shown = ",".join(label for label, _ in combo)
            item["abbr"] = f"{base['abbr']}[{shown}]"
            variants[item["abbr"]] = {"base": base["abbr"], "labels": labels}
            out.append(item)
    return out


def _sweep_dict(raw: dict[str, Any], where: str) -> dict[str, Any] | None:
    sweep = raw.get("sweep")
    if sweep is None:
        return None
    if not isinstance(sweep, dict):
        raise ConfigError(f"{where}: expected a dict with {', '.join(SWEEP_KEYS)}, got {sweep!r}")
    return sweep


def _max_variants(sweep: dict[str, Any], where: str) -> int:
    max_variants = sweep.get("max_variants", DEFAULT_MAX_VARIANTS)
    if not isinstance(max_variants, int) or isinstance(max_variants, bool) or max_variants < 1:
        raise ConfigError(f"{where}.max_variants: expected an integer >= 1, got {max_variants!r}")
    return max_variants


def _bases(raw: dict[str, Any], sweep: dict[str, Any], kind: str, where: str) -> list[Any]:
    bases = sweep.get(kind, raw.get(kind))
    if not isinstance(bases, list) or not bases:
        raise ConfigError(f"{where}: {kind} must be a non-empty list (in the sweep or the config), got {bases!r}")
    return bases


EXPANDED_KEYS = ("expanded", "axes", "variants", "baseline", "max_variants", "num_models", "num_datasets")


def _saved(sweep: dict[str, Any], where: str) -> SweepInfo:
    """The :class:`SweepInfo` a run saved in its config (``expanded``), checked as it is read back:
    the file may have been edited, or copied as a config of its own."""
    check_known_keys(sweep, EXPANDED_KEYS, where, of="of a saved (expanded) sweep")
    axes, variants, baseline = sweep.get("axes", []), sweep.get("variants", {}), sweep.get("baseline", {})
    if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
        raise ConfigError(f"{where}.axes: expected a list of axis names, got {axes!r}")
    if not isinstance(baseline, dict) or not all(isinstance(v, str) for v in baseline.values()):
        raise ConfigError(f"{where}.baseline: expected a dict of axis name -> value name, got {baseline!r}")
    shape = "dict(models={abbr: dict(base=..., labels={...})}, datasets={...})"
    if not isinstance(variants, dict) or set(variants) - {"models", "datasets"}:
        raise ConfigError(f"{where}.variants: expected {shape}")
    for kind, named in variants.items():
        if not isinstance(named, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("base"), str) and isinstance(v.get("labels"), dict)
                for v in named.values()):
            raise ConfigError(f"{where}.variants.{kind}: expected {shape}")
    counts = [sweep.get(key, default) for key, default in
              (("max_variants", DEFAULT_MAX_VARIANTS), ("num_models", 0), ("num_datasets", 0))]
    for key, value in zip(("max_variants", "num_models", "num_datasets"), counts):
        if not isinstance(value, int) or isinstance(value, bool) or value < (key == "max_variants"):
            raise ConfigError(f"{where}.{key}: expected an integer >= {int(key == 'max_variants')}, got {value!r}")
    return SweepInfo(list(axes), dict(variants), dict(baseline), *counts)


def sweep_size(raw: dict[str, Any], source: str) -> tuple[int, int] | None:
    """(model, dataset) pairs the sweep would make and its ``max_variants``, without expanding it.

    The count is a product of list lengths, so a sweep too large to run is refused before a
    single variant is built (None without a sweep).
    """
    where = f"{source}: sweep"
    sweep = _sweep_dict(raw, where)
    if sweep is None:
        return None
    check_secrets(raw, source)  # before a message below could quote a model or dataset holding one
    if sweep.get("expanded"):
        info = expand_sweep(raw, source)
        assert info is not None
        return info.count(), info.max_variants
    check_known_keys(sweep, SWEEP_KEYS, where)
    axes = _axes(sweep.get("params"), where)
    pairs = 1
    for kind in ("models", "datasets"):
        pairs *= len(_bases(raw, sweep, kind, where)) * math.prod(len(a.values) for a in axes if a.kind == kind)
    return pairs, _max_variants(sweep, where)


def check_sweep_size(raw: dict[str, Any], source: str) -> None:
    """Refuse a sweep of more (model, dataset) pairs than its ``max_variants`` before expanding it."""
    size = sweep_size(raw, source)
    if size is not None and size[0] > size[1]:
        raise UserError(f"{source}: the sweep expands to {size[0]} (model, dataset) pairs, more than "
                        f"sweep.max_variants={size[1]}; pass --yes (yes=True) to plan it (--dry-run --yes) "
                        "or run it")


def expand_sweep(raw: dict[str, Any], source: str) -> SweepInfo | None:
    """Replace ``raw``'s models and datasets by the sweep's variants (in place); None without a sweep.

    A config saved by a run holds the variants already and a ``sweep`` marked ``expanded``:
    it is read back, not expanded twice.
    """
    where = f"{source}: sweep"
    sweep = _sweep_dict(raw, where)
    if sweep is None:
        return None
    if sweep.get("expanded"):
        return _saved(sweep, where)
    check_known_keys(sweep, SWEEP_KEYS, where)
    axes = _axes(sweep.get("params"), where)
    info = SweepInfo([a.name for a in axes], {"models": {}, "datasets": {}}, {}, _max_variants(sweep, where))
    for kind in ("models", "datasets"):
        raw[kind] = _expand(kind, _bases(raw, sweep, kind, where), axes, where, info.variants[kind])
    info.num_models, info.num_datasets = len(raw["models"]), len(raw["datasets"])
    baseline = sweep.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise ConfigError(f"{where}.baseline: expected a dict of axis name -> value name, got {baseline!r}")
    by_name = {a.name: a for a in axes}
    for name, value in baseline.items():
        if name not in by_name:
            raise ConfigError(f"{where}.baseline: {name!r} is not an axis; axes: {', '.join(by_name)}")
        labels = {label: label for label in by_name[name].values} | {
            _label(v): label for label, v in by_name[name].values.items()}
        if _label(value) not in labels:
            raise ConfigError(f"{where}.baseline.{name}: {value!r} is not one of its values: "
                              f"{', '.join(by_name[name].values)}")
        info.baseline[name] = labels[_label(value)]
    raw["sweep"] = info.to_dict()
    return info
