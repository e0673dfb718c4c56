"""The launchers' one error, below both the package (``tools.launch``) and the SLURM launcher, which raise it."""


class LaunchError(ValueError):
    """A launcher that cannot start (submitit missing, no SLURM client) or a bad ``--slurm-*`` option."""
