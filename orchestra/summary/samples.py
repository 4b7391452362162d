"""Per-sample records for the report's drill-down, packed small and loaded lazily.

Each dataset's prompts and gold answers are stored once (every model saw the same prompt),
each (model, dataset) pair's predictions and verdicts once more.  A pack is columnar JSON,
raw-deflated and base64-encoded; the page inflates one with the browser's own
``DecompressionStream('deflate-raw')`` only when someone opens it, so 100,000 samples cost
nothing until they are looked at.  Long texts are shortened (head and tail kept) so that the
packs fit ``budget_bytes``; the full texts stay in the run folder's prediction files.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import read_jsonl, read_sealed_jsonl
from orchestra.paths import RunPaths
from orchestra.tasks.spec import Unit

#: what the packs of one report may weigh (base64 included) before texts are shortened more
DEFAULT_BUDGET_BYTES = 7_000_000
_MIN_CHARS = 160
# record fields that are shown in their own column, not among the "other" fields
_OWN = {"id", "prompt", "prediction", "gold", "error", "turns"}


@dataclass
class Pack:
    """One encoded pack: the page finds it by ``key`` (an element id)."""

    key: str
    data: str  # base64 of raw deflate of UTF-8 JSON


@dataclass
class SampleIndex:
    """What the drill-down can open: ``pairs[(model, dataset)]`` -> pack keys and counts."""

    pairs: dict[str, dict[str, Any]] = field(default_factory=dict)
    packs: list[Pack] = field(default_factory=list)
    shortened: bool = False  # some texts were cut to fit the budget
    limits: dict[str, int] = field(default_factory=dict)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in value)
    return json.dumps(value, ensure_ascii=False)


def _cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: a quarter from its start, the rest from its end
    (a few-shot prompt's question is at its end)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n… [{len(text) - limit} characters cut; full text in the run folder] …\n{text[-tail:]}"


def pack_json(obj: Any) -> str:
    """``obj`` as the page's packs carry it: base64 of raw deflate of UTF-8 JSON (the page
    inflates it with ``DecompressionStream("deflate-raw")``)."""
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(comp.compress(raw) + comp.flush()).decode("ascii")


def _read_pair(paths: RunPaths, model: str, unit: Unit) -> tuple[dict[Any, dict[str, Any]], list[dict[str, Any]]]:
    """(prediction records by id, detail records) of one (model, dataset); either may be empty."""
    preds: dict[Any, dict[str, Any]] = {}
    for path, _ in unit.inputs:
        sealed = read_sealed_jsonl(path)
        if sealed is not None:
            for rec in sealed[1]:
                if isinstance(rec, dict) and "id" in rec:
                    preds[rec["id"]] = rec
    details_path = paths.details(model, unit.dataset_abbr)
    details = [d for d in read_jsonl(details_path) if isinstance(d, dict)] if os.path.exists(details_path) else []
    return preds, details


def build_samples(paths: RunPaths, eval_units: list[tuple[str, Unit]], headline: dict[str, str],
                  budget_bytes: int = DEFAULT_BUDGET_BYTES, prompt_chars: int = 2000,
                  answer_chars: int = 1000) -> SampleIndex:
    """Pack every (model, dataset)'s samples; ``headline[dataset]`` names the metric whose
    per-sample verdict is the score column."""
    pairs = []
    for model, unit in eval_units:
        preds, details = _read_pair(paths, model, unit)
        if preds or details:
            pairs.append((model, unit.dataset_abbr, preds, details))
    index = SampleIndex()
    limits = {"prompt": prompt_chars, "answer": answer_chars}
    for _ in range(4):
        index = _pack_all(pairs, headline, limits)
        size = sum(len(p.data) for p in index.packs)
        if size <= budget_bytes or limits["prompt"] <= _MIN_CHARS:
            break
        scale = budget_bytes / size * 0.85
        limits = {k: max(_MIN_CHARS, int(v * scale)) for k, v in limits.items()}
        index.shortened = True
    return index


def _pack_all(pairs: list[tuple[str, str, dict[Any, dict[str, Any]], list[dict[str, Any]]]],
              headline: dict[str, str], limits: dict[str, int]) -> SampleIndex:
    index = SampleIndex(limits=dict(limits))
    prompt_keys: dict[str, tuple[str, dict[Any, int], list[str]]] = {}  # dataset -> (key, id -> row, prompts)
    shortened = False
    for model, dataset, preds, details in pairs:
        if dataset not in prompt_keys:
            ids = sorted(preds, key=lambda i: (str(type(i)), i))
            prompts, golds = [], []
            for i in ids:
                rec = preds[i]
                text = _text(rec.get("prompt") if "prompt" in rec else rec.get("turns"))
                shortened |= len(text) > limits["prompt"]
                prompts.append(_cut(text, limits["prompt"]))
                golds.append(_cut(_text(rec.get("gold")), limits["answer"]))
            key = f"p{len(prompt_keys)}"
            prompt_keys[dataset] = (key, {i: n for n, i in enumerate(ids)}, prompts)
            index.packs.append(Pack(key, pack_json({"id": ids, "prompt": prompts, "gold": golds})))
        pkey, rows, prompts = prompt_keys[dataset]
        by_id = {d.get("id"): d for d in details}
        ids = list(by_id) if by_id else sorted(preds, key=lambda i: (str(type(i)), i))
        metric = headline.get(dataset, "")
        cols: dict[str, list[Any]] = {"id": [], "row": [], "prediction": [], "score": [], "error": [], "other": [],
                                      "prompt": []}
        for i in ids:
            rec, det = preds.get(i, {}), by_id.get(i, {})
            pred = _text(det.get("prediction", rec.get("prediction")))
            shortened |= len(pred) > limits["answer"]
            other = {k: v for k, v in det.items() if k not in _OWN and k != metric}
            other.update({k: v for k, v in rec.items() if k not in _OWN and k not in other})
            own_prompt = _cut(_text(rec.get("prompt", rec.get("turns"))), limits["prompt"]) if rec else ""
            row = rows.get(i)
            cols["id"].append(i)
            cols["row"].append(row)
            cols["prediction"].append(_cut(pred, limits["answer"]))
            verdict = det.get(metric)
            cols["score"].append(verdict if isinstance(verdict, (bool, int, float)) else None)
            cols["error"].append(det.get("error") or rec.get("error"))
            cols["other"].append(_cut(json.dumps(other, ensure_ascii=False), limits["answer"]) if other else None)
            # a model whose prompt differed (another chat template) keeps its own
            cols["prompt"].append(own_prompt if row is None or (own_prompt and own_prompt != prompts[row]) else None)
        key = f"s{len(index.pairs)}"
        index.packs.append(Pack(key, pack_json(cols)))
        scored = [s for s in cols["score"] if s is not None]
        index.pairs[f"{model}\u0000{dataset}"] = {"model": model, "dataset": dataset, "key": key, "prompts": pkey,
                                                  "n": len(ids), "metric": metric,
                                                  "right": sum(1 for s in scored if s), "scored": len(scored)}
    index.shortened = shortened
    return index
