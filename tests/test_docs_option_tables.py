"""The option tables of docs/ name exactly the arguments the code takes.

Each table's first column lists option names in backticks; the set must equal the constructor's
arguments (or the keys the code validates against), so that a new argument cannot go
undocumented and a documented one cannot be a key the config checker refuses.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def table_names(doc: str, header: str) -> set[str]:
    """The backticked names in the first column of the table whose header row starts with
    ``header``, below the line ``heading`` leads to (the first such table of the page)."""
    lines = (REPO / "docs" / doc).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names: set[str] = set()
    for line in lines[start + 2:]:  # past the header and the |---| row
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        names.update(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)", first))
    return names


def init_args(cls: type, *, leave_out: Iterable[str] = ()) -> set[str]:
    skip = {"self", *leave_out}
    return {p for p in inspect.signature(cls.__init__).parameters if p not in skip}


def config_keys(cls: type, *, leave_out: Iterable[str] = ()) -> set[str]:
    """The keys the config check takes for ``cls``: its arguments, with a runner's loop options
    (``**loop: Unpack[...]``) read as the config check reads them."""
    from orchestra.config.schema import _signature_params

    return set(_signature_params(cls)[0]) - set(leave_out)


def _openai() -> set[str]:
    from orchestra.models import OpenAIAPI

    return init_args(OpenAIAPI, leave_out=["abbr"])


def _batch() -> set[str]:
    from orchestra.models.batch.options import BatchOptions

    return {f.name for f in dataclasses.fields(BatchOptions)}


def _slurm() -> set[str]:
    from orchestra.runners.slurm.runner import SlurmRunner

    return config_keys(SlurmRunner)


def _ray() -> set[str]:
    from orchestra.runners.ray.runner import RayRunner

    return config_keys(RayRunner)


def _dlc() -> set[str]:
    from orchestra.runners.dlc.runner import DLCRunner

    return config_keys(DLCRunner, leave_out=["aliyun_cfg"])  # its own table


def _aliyun() -> set[str]:
    from orchestra.runners.dlc.config import AliyunConfig

    return {f.name for f in dataclasses.fields(AliyunConfig)}


def _code_exec() -> set[str]:
    from orchestra.evaluators.code import CodeExecEvaluator

    return init_args(CodeExecEvaluator)


def _judge() -> set[str]:
    from orchestra.evaluators.judge import JudgeEvaluator

    return init_args(JudgeEvaluator)


def _server() -> set[str]:
    from orchestra.serving.spec import KEYS

    return set(KEYS)


def _hf() -> set[str]:
    from orchestra.models.hf import HFCausalLM

    return init_args(HFCausalLM)


TABLES: list[tuple[str, str, Callable[[], set[str]]]] = [
    ("api.md", "| key | meaning | default |", _openai),
    ("api.md", "| `batch` key |", _batch),
    ("slurm.md", "| option | default | meaning |", _slurm),
    ("ray.md", "| option | default | meaning |", _ray),
    ("dlc.md", "| option | default | meaning |", _dlc),
    ("dlc.md", "| key | default | meaning |", _aliyun),
    ("scoring.md", "| key | default | meaning |", _code_exec),
    ("serving.md", "| key | engines | meaning |", _server),
    ("models.md", "| argument | default | meaning |", _hf),
]


@pytest.mark.parametrize(("doc", "header", "code"), TABLES, ids=[f"{d}:{f.__name__[1:]}" for d, _, f in TABLES])
def test_an_option_table_lists_exactly_the_code_s_arguments(doc: str, header: str,
                                                             code: Callable[[], set[str]]) -> None:
    documented, taken = table_names(doc, header), code()
    assert not taken - documented, f"docs/{doc}: arguments missing from the table: {sorted(taken - documented)}"
    assert not documented - taken, f"docs/{doc}: the table lists what the code does not take: " \
                                   f"{sorted(documented - taken)}"


def test_the_judge_table_lists_exactly_judge_evaluator_s_arguments() -> None:
    """scoring.md has two tables of the same header: the judge's is the one after its heading."""
    lines = (REPO / "docs/scoring.md").read_text(encoding="utf-8").splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("## LLM-as-judge"))
    rest = "\n".join(lines[heading:])
    start = rest.index("| key | default | meaning |")
    names: set[str] = set()
    for line in rest[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        names.update(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)", line.split("|")[1]))
    assert names == _judge()


def _signature_defaults(cls: type) -> dict[str, object]:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("name", ["NaivePartitioner", "SizePartitioner", "NumWorkerPartitioner", "InferTask"])
def test_the_user_guide_s_signatures_have_the_code_s_defaults(name: str) -> None:
    """``SizePartitioner(max_task_size=40000, ...)`` in the user guide: every argument shown exists
    with that default (``{}`` shown for a ``None`` that the class turns into an empty dict)."""
    import ast

    from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner, SizePartitioner
    from orchestra.tasks import InferTask

    cls = {c.__name__: c for c in (NaivePartitioner, SizePartitioner, NumWorkerPartitioner, InferTask)}[name]
    text = (REPO / "docs/user-guide.md").read_text(encoding="utf-8")
    shown = re.search(rf"`{name}\(([^`]*)\)`", text)
    assert shown, f"docs/user-guide.md shows no `{name}(...)`"
    call = ast.parse(f"f({shown.group(1)})", mode="eval").body
    assert isinstance(call, ast.Call)
    defaults = _signature_defaults(cls)
    for kw in call.keywords:
        assert kw.arg in defaults, f"{name}: the user guide shows {kw.arg!r}, which {name} does not take"
        doc_value = ast.literal_eval(kw.value)
        code_value = defaults[kw.arg]
        assert doc_value == code_value or (doc_value == {} and code_value is None), \
            f"{name}.{kw.arg}: the user guide says {doc_value!r}, the code {code_value!r}"
