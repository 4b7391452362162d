"""Run an evaluation: ``python run.py configs/eval_llama.py`` (same as the ``orchestra`` command)."""

import sys

from orchestra.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
