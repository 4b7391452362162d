"""The registries: short names, dotted paths, kinds, and no silent overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra.errors import ConfigError
from orchestra.registry import DATASETS, EVALUATORS, MODELS, PARTITIONERS, Registry, import_dotted


def test_short_name_dotted_path_and_class_resolve_to_the_same_class() -> None:
    cls = PARTITIONERS.resolve("SizePartitioner", "where")
    assert PARTITIONERS.resolve("orchestra.partitioners.size.SizePartitioner", "where") is cls
    assert PARTITIONERS.resolve("orchestra.partitioners.size:SizePartitioner", "where") is cls
    assert PARTITIONERS.resolve(cls, "where") is cls


@pytest.mark.parametrize("spec", ["NoSuch", "orchestra.nope.Thing", "orchestra.partitioners.size.Nope", "x"])
def test_unknown_names_list_the_valid_ones(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"^cfg\.py: infer\.partitioner: unknown partitioner type") as info:
        PARTITIONERS.resolve(spec, "cfg.py: infer.partitioner")
    assert "NaivePartitioner, NumWorkerPartitioner, SizePartitioner" in str(info.value)


@pytest.mark.parametrize(("registry", "spec"), [
    (MODELS, "orchestra.datasets.files.JsonlDataset"),
    (DATASETS, "orchestra.models.fake.DeterministicModel"),
    (EVALUATORS, "orchestra.partitioners.size.SizePartitioner"),
    (PARTITIONERS, "orchestra.registry.Registry"),
])
def test_a_class_of_another_kind_is_refused(registry: Registry, spec: str) -> None:
    with pytest.raises(ConfigError, match=f"is not a {registry.kind}"):
        registry.resolve(spec, "where")


@pytest.mark.parametrize("spec", [None, "", 3, ["SizePartitioner"]])
def test_type_must_be_a_class_or_a_name(spec: object) -> None:
    with pytest.raises(ConfigError, match="type must be a class or a name"):
        PARTITIONERS.resolve(spec, "where")


def test_no_silent_overwrite() -> None:
    reg = Registry("thing", {"A": "pkg.mod.A"})
    with pytest.raises(KeyError, match="'A' is already registered as pkg.mod.A"):
        reg.register("A", "other.mod.A")


def test_a_missing_dependency_of_an_existing_module_surfaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_missing.py").write_text("import surely_not_installed_pkg\nclass X: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="surely_not_installed_pkg"):
        import_dotted("needs_missing.X")
    assert import_dotted("surely_not_a_module.X") is None
