"""Old module names of moved files, so configs and checkpoints written before a move still load.

A config or checkpoint names its classes by import path (``class_path: lit_icl.mmca.nets.DeepCrossAttention``),
and Lightning stores that path in every checkpoint's hyper-parameters. When a file moves (``lit_icl/mmca/nets.py``
became ``lit_icl/mmca/synthetic/nets.py``), the paper's ``__init__`` calls :func:`alias_modules` with the old
and new names: importing the old name then returns the new module, for jsonargparse and pickle alike. New configs
name each paper's public names (``lit_icl.mmca.DeepCrossAttention``), which do not depend on files.
"""

from __future__ import annotations

import importlib
import sys


def alias_modules(aliases: dict[str, str]) -> None:
    """Make ``import old`` return the module ``new`` for every ``old: new`` pair (idempotent)."""
    for old, new in aliases.items():
        module = importlib.import_module(new)
        sys.modules.setdefault(old, module)
        parent, _, leaf = old.rpartition(".")
        if parent in sys.modules and not hasattr(sys.modules[parent], leaf):
            setattr(sys.modules[parent], leaf, module)  # `from lit_icl.mmca import nets` works too
