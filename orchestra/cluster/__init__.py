"""Clients of external job services, below the runners and serving so that both may use them:
one call of a client (``cli``), a launch's counted calls (``client``), stop-and-confirm
(``confirm``), the refusal schedule (``refusal``) and the one Slurm client (``slurm``)."""
