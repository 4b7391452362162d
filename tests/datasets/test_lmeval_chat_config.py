"""LmEvalDataset's chat options are checked as ``lm_eval`` checks them, and a model that cannot read
chat messages lm-eval's way is one line at config time (exit 2), naming the model and the dataset.

The model checks read files only (a tokenizer folder's ``tokenizer_config.json``, a GGUF file's
``tokenizer.chat_template``), so the refusals come before any task starts. ``run.py`` runs forked
from the ``cli`` fork server (``tests/cli_fork.py``), which has imported what every CLI process
imports: a refusal at config time is then ~0.2 s of CPU instead of ~0.7 s. Its environment sets
no ``PYTHONPATH`` (the editable install finds orchestra): one that differs from the server's in
what the interpreter reads at start-up runs a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.datasets.lmeval import LmEvalDataset
from orchestra.errors import ConfigError
from orchestra.models.hf_common import smollm2_gguf
from tests.cli_fork import ForkedCLI
from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]


def _run(cli: ForkedCLI, tmp_path: Path, model: str, dataset: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.hf import HFCausalLM\n"
        "from orchestra.models.openai_api import OpenAIAPI\n"
        f"models = [{model}]\n"
        f"datasets = [{dataset}]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    return cli.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True, env=env,
                   cwd=tmp_path, timeout=300)


def _one_line(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_chat_settings_are_checked_as_lm_eval_checks_them() -> None:
    with pytest.raises(ConfigError, match="fewshot_as_multiturn=True needs apply_chat_template=True"):
        LmEvalDataset(abbr="x", task="arc_easy", fewshot_as_multiturn=True)
    with pytest.raises(ConfigError, match="apply_chat_template='yes': expected True or False"):
        LmEvalDataset(abbr="x", task="arc_easy", apply_chat_template="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="system_instruction=3: expected a string"):
        LmEvalDataset(abbr="x", task="arc_easy", system_instruction=3)  # type: ignore[arg-type]
    # lm-eval's defaults: few-shot examples as turns with the chat template; the settings (and
    # with them the content key) of a dataset without chat options are what they were
    chat = LmEvalDataset(abbr="x", task="arc_easy", apply_chat_template=True).settings
    assert (chat["fewshot_as_multiturn"], chat["system_instruction"]) == (True, None)
    assert "apply_chat_template" not in LmEvalDataset(abbr="x", task="arc_easy").settings
    plain = LmEvalDataset(abbr="x", task="arc_easy", system_instruction="Be brief.").settings
    assert (plain["apply_chat_template"], plain["fewshot_as_multiturn"]) == (False, False)


def test_the_bundled_ggufs_chat_template_is_read_from_its_header(tmp_path: Path) -> None:
    from orchestra.models.chat_template import gguf_chat_template

    template = gguf_chat_template(smollm2_gguf())
    assert template is not None and "<|im_start|>" in template and "add_generation_prompt" in template
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(smollm2_gguf()).read_bytes()[:4096])  # the header runs past the end
    with pytest.raises(ValueError):
        gguf_chat_template(str(cut))


def test_a_model_without_a_chat_template_is_one_line_at_config_time(tmp_path: Path, cli: ForkedCLI) -> None:
    folder = tmp_path / "base_model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    proc = _run(cli, tmp_path, f"dict(type=HFCausalLM, abbr='base', path={str(folder)!r})",
                "dict(type=LmEvalDataset, abbr='arc', task='arc_easy', apply_chat_template=True)")
    _one_line(proc, "models[0] ('base')", "datasets[0] ('arc')", "apply_chat_template=True", "no chat template")


def test_a_completions_endpoint_is_one_line_at_config_time(tmp_path: Path, cli: ForkedCLI) -> None:
    proc = _run(cli, tmp_path, "dict(type=OpenAIAPI, abbr='api', path='m', base_url='http://127.0.0.1:9/v1', "
                          "key_env=None, endpoint='completions')",
                "dict(type=LmEvalDataset, abbr='gsm', task='gsm8k', apply_chat_template=True)")
    _one_line(proc, "models[0] ('api')", "datasets[0] ('gsm')", "endpoint='completions' sends plain text")


@pytest.mark.slow
def test_multiple_choice_on_a_chat_endpoint_is_one_line_at_config_time(tmp_path: Path, cli: ForkedCLI,
                                                                     lmeval_index: LmEvalIndex) -> None:
    """A chat endpoint takes lm-eval's messages but cannot score them: the probe says ARC needs
    log-likelihoods, and the config is refused before anything runs."""
    lmeval_index.seed(tmp_path / "cache")  # lm-eval's stock index, built once per session
    out = tmp_path / "lm"
    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(out)], check=True,
                   capture_output=True)
    proc = _run(cli, tmp_path, "dict(type=OpenAIAPI, abbr='api', path='m', base_url='http://127.0.0.1:9/v1', "
                          "key_env=None, endpoint='chat')",
                f"dict(type=LmEvalDataset, abbr='arc', task='arc_easy', include_path={str(out / 'tasks')!r}, "
                "apply_chat_template=True)")
    _one_line(proc, "models[0] ('api')", "datasets[0] ('arc')", "'multiple_choice'", "needs log-likelihoods",
              "HFCausalLM")
