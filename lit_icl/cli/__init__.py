"""``python -m lit_icl`` / ``lit-icl``: one LightningCLI for every paper (:mod:`lit_icl.cli.app`).

- :mod:`~lit_icl.cli.app`: :class:`LitICLCLI` (the defaults and the order of the checks), :func:`main`, which
  turns every refusal into one line ``lit_icl: error: ...`` and exit status 2, and :func:`process_defaults`;
- :mod:`~lit_icl.cli.checkpoints`: ``--ckpt_path last|best`` resolution and the checkpoint checks;
- :mod:`~lit_icl.cli.naming`: run folders named after their config files;
- :mod:`~lit_icl.cli.paths`: ``~`` in the paths a run reads or writes, expanded once;
- :mod:`~lit_icl.cli.checks`: the input checks made before anything is written;
- :mod:`~lit_icl.cli.messages`: errors condensed to one line;
- :mod:`~lit_icl.cli.trainer_setup`: early stopping, compiled nets and the progress bar added to the trainer.
"""

from lit_icl.cli.app import LitICLCLI, main, process_defaults
from lit_icl.cli.checkpoints import check_ckpt_classes, resolve_ckpt_path
from lit_icl.cli.naming import DEFAULT_RUN_NAME, run_name

__all__ = ["DEFAULT_RUN_NAME", "LitICLCLI", "check_ckpt_classes", "main", "process_defaults", "resolve_ckpt_path", "run_name"]
