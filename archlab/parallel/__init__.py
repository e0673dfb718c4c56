"""Parallel wiring (the only package that imports DeepSpeed): expert parallelism in ``expert``."""
