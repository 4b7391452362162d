"""The exceptions orchestra raises on purpose.

``UserError`` and its children are mistakes in what the user gave us (a config, a flag, a
path): the CLI prints them as one line and exits 2.  Everything else is a bug or an
infrastructure failure and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class OrchestraError(Exception):
    """Base of every exception orchestra raises deliberately."""


class UserError(OrchestraError):
    """Bad input from the user; printed as one line, exit code 2."""


class ConfigError(UserError):
    """A config file, a key in it, or a ``--cfg-options`` value is invalid."""


class RunFolderBusyError(UserError):
    """Another orchestrator holds the lock of this run folder."""


class Stopped(BaseException):
    """The run's stop flag was set (a signal) while a runner waited for something outside the
    scheduling loop (a cluster connection): ``stages.run_stages`` takes it as a stage that ran
    nothing, and the run ends as interrupted, as for any stop."""


class ModelError(OrchestraError):
    """A model call failed in a way that retrying will not fix."""


class TaskFailedError(OrchestraError):
    """A task script ends with this when its work is incomplete (failed samples, missing inputs)."""


def check_known_keys(given: Iterable[str], valid: Sequence[str], where: str, *, of: str = "",
                     error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` for the first of ``given`` not in ``valid``, in the one wording every
    config check uses: ``WHERE: unknown key 'k' [OF]; valid keys: a, b`` (``valid`` listed in
    the order given; "it takes no keys" when it is empty)."""
    allowed = set(valid)
    for key in given:
        if key not in allowed:
            listed = f"valid keys: {', '.join(valid)}" if valid else "it takes no keys"
            raise error(f"{where}: unknown key {key!r}{' ' + of if of else ''}; {listed}")
