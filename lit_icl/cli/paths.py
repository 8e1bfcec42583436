"""Paths a run reads or writes, given with ``~`` (``--ckpt_path ~/runs/...``, ``save_dir: ~/runs`` in a YAML file)."""

from __future__ import annotations

import os
from typing import Any


def _expanded(value: Any) -> Any:
    """``value`` with a leading ``~`` or ``~user`` replaced by that home folder; anything else as it is."""
    return os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value


def expand_home(config: Any) -> None:
    """Replace a leading ``~`` by the home folder in the config's ``ckpt_path``, ``trainer.default_root_dir``,
    ``checkpoint.dirpath`` and every logger's ``save_dir``, in place, before anything reads them.

    The shell expands ``~`` only at the start of a word, so it reaches the program from a YAML file, from
    ``--ckpt_path=~/...`` and from a quoted argument. Lightning expands it in some places and not in others: the
    TensorBoard logger wrote its events under the home folder but the checkpoint callback put the run's
    checkpoints under a folder named ``~`` in the working folder, and the logger looked for earlier versions
    there too, so every run was ``version_0`` (a second ``test`` wrote over the first's results); a ``~`` in
    ``--ckpt_path`` was refused as a file that does not exist, and ``--ckpt_path last`` did not find a
    ``--checkpoint.dirpath ~/...``. Expanded once here, every part of the run, and the saved ``config.yaml``, name
    the same folders.
    """
    if config.get("ckpt_path") is not None:
        config.ckpt_path = _expanded(config.ckpt_path)
    trainer = config.get("trainer")
    if trainer is not None:
        if trainer.get("default_root_dir") is not None:
            trainer.default_root_dir = _expanded(trainer.default_root_dir)
        loggers = trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            init = getattr(logger, "init_args", None)
            if init is not None and init.get("save_dir") is not None:
                init.save_dir = _expanded(init.save_dir)
    checkpoint = config.get("checkpoint")
    if checkpoint is not None and checkpoint.get("dirpath") is not None:
        checkpoint.dirpath = _expanded(checkpoint.dirpath)
