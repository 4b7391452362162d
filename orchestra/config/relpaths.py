"""Where a relative data path of a config is looked up (a dataset's ``path``, an lm-eval
dataset's ``include_path``): the user guide's rule, made safe for shared folders.

A relative path is looked up from where orchestra runs, then from the config file's folder and
each folder above it, so ``configs/data/x.jsonl`` is found from anywhere.  The folders above
a config reach shared ones (``/tmp`` for a config kept in ``/tmp/me/configs``), where any local
user can create ``/tmp/tasks``: a candidate found there is taken only when every entry from the
folder searched down to it (a symbolic link judged as itself) belongs to this user or to root.
An lm-eval ``include_path`` runs the Python its YAMLs name, so a planted folder would be code.
"""

from __future__ import annotations

import os


def found(path: str, config_dir: str) -> str:
    """``path`` made absolute where the lookup finds it; unchanged when it is absolute, starts
    with ``~`` (the dataset expands it to the home folder) or is found nowhere."""
    if not path or os.path.isabs(path) or path.startswith("~"):
        return path
    if os.path.exists(path):  # the working folder: the user's own choice, as for any relative path
        return os.path.abspath(path)
    ancestors, folder = [], config_dir
    while folder and folder not in ancestors:
        ancestors.append(folder)
        folder = os.path.dirname(folder)
    for ancestor in ancestors:
        candidate = os.path.join(ancestor, path)
        if os.path.exists(candidate) and _owned_below(ancestor, path):
            return os.path.abspath(candidate)
    return path


def _owned_below(folder: str, relative: str) -> bool:
    """Whether each entry of ``relative`` under ``folder`` (not following links) belongs to this
    user or to root: nobody else could have put it there."""
    trusted = {os.geteuid(), 0}
    current = folder
    for part in os.path.normpath(relative).split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            if os.lstat(current).st_uid not in trusted:
                return False
        except OSError:
            return False
    return True
