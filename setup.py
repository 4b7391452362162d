"""orchestra: evaluate language models at scale."""

from setuptools import find_packages, setup


def _requirements(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


setup(
    name="orchestra",
    version="0.1.0",
    description="Evaluate language models at scale: partition, run anywhere, summarise.",
    packages=find_packages(include=["orchestra", "orchestra.*"]),
    # the report's template, CSS and JS, inlined into every report.html
    package_data={"orchestra.summary": ["report_assets/*"]},
    python_requires=">=3.10",
    install_requires=_requirements("requirements.txt"),
    extras_require={
        "hf": ["torch", "transformers", "gguf", "accelerate"],
        # RayRunner; [client] for ray:// addresses (Ray Client); tested with Ray 2.60
        "ray": ["ray[client]>=2.60"],
        # LmEvalDataset: lm-evaluation-harness's task library (docs/lm-eval.md); pinned, since
        # orchestra drives lm-eval's own evaluate loop and its request/metric shapes
        "lmeval": ["lm_eval==0.4.13"],
        # scipy and statsmodels: the oracles orchestra/stats.py is tested against (never imported by orchestra)
        # tenacity: lm-eval's API models (local-chat-completions, the reference of the chat-endpoint tests)
        "test": ["pytest", "pytest-xdist", "tenacity", "aiohttp", "ruff", "mypy", "import-linter", "xllamacpp",
                 "openai", "anthropic", "scipy", "statsmodels"],
    },
    entry_points={"console_scripts": ["orchestra=orchestra.cli.main:main"]},
)
