"""The GGUF read once per conversion (orchestra/models/gguf_convert.py): inside the block the
real SmolLM2 file is parsed once however often transformers asks, and gguf is itself after."""

from __future__ import annotations

import gguf

from orchestra.models.gguf_convert import gguf_read_once
from orchestra.models.hf_common import smollm2_gguf


def test_one_reader_per_file_inside_the_block_and_gguf_restored_after() -> None:
    path = smollm2_gguf()
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is first  # transformers' second and third reads
        assert isinstance(first, reader_cls) and "general.architecture" in first.fields
        arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert gguf.GGUFReader is reader_cls and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not first
