"""orchestra: evaluate language models at scale, from one config file."""

__version__ = "0.1.0"
