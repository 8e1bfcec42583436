"""One process per run folder: a run holds an exclusive lock on its folder while it runs.

Two processes writing one folder (a fit resumed twice with ``--ckpt_path last``, or two runs given the same
``--trainer.logger.init_args.version``) would both train the same steps, save ``last.ckpt`` and ``last-v1.ckpt``
side by side, interleave their TensorBoard events and leave one process's ``config.yaml``; nothing before the
run starts can tell, because the folder only fills as they run. The lock is ``flock`` on the folder itself, so no
lock file is left behind and the kernel releases it when the process ends, however it ends (SIGKILL included).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_icl.core.errors import ConfigError

try:
    import fcntl
except ImportError:  # not a POSIX system: runs go unlocked
    fcntl = None  # type: ignore[assignment]

#: ``(descriptor, the folders made for it, deepest first)`` per folder locked by the current run (released by
#: :func:`release_run_folders`).
_HELD: list[tuple[int, list[Path]]] = []

#: Rank 0's refusal of a run whose other ranks a cluster started (srun, torchrun), held back until the process
#: group has formed and every rank can hear it (see :func:`_pass_refusal_on`).
_PENDING: list[str] = []


def _ranks_started_outside(trainer: Trainer) -> bool:
    """Whether the other ranks of this run are processes that srun or torchrun started beside this one, rather than
    children Lightning launches from it once the run starts."""
    env = getattr(trainer.strategy, "cluster_environment", None)
    return trainer.world_size > 1 and env is not None and env.creates_processes_externally


def lock_run_folder(trainer: Trainer) -> Path | None:
    """Lock the run's folder (the logger's ``log_dir``, created if new) for this process, or refuse the run in
    one line when another process holds it. Only global rank 0 locks: the other ranks of a DDP run write into
    rank 0's folder by design. A file system without ``flock`` (some network mounts) leaves the run unlocked."""
    if trainer.world_size > 1:
        _pass_refusal_on(trainer)  # on every rank: each takes part in the broadcast
    if fcntl is None or rank_zero_only.rank != 0 or not trainer.loggers:
        return None
    log_dir = trainer.log_dir
    if not log_dir or "://" in str(log_dir):  # remote storage: its client's business
        return None
    folder = Path(log_dir).absolute()
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        message = (
            f"the run folder {folder} is in use by another lit_icl process (the same run started twice, or two runs "
            "given one --trainer.logger.init_args.version); wait for it to end, or give this run another version")
        if _ranks_started_outside(trainer):
            # The other ranks are already running and will wait in the process group's set-up for rank 0 until
            # its timeout (30 minutes), holding their devices. _pass_refusal_on passes the refusal on to them once
            # the group has formed, before anything is written, and every rank stops with it.
            _PENDING.append(message)
            return None
        raise ConfigError(message) from None
    except OSError:
        os.close(fd)
        return None
    _HELD.append((fd, made))
    return folder


def release_run_folders() -> None:
    """Release the folders this process locked (at the end of a CLI call; a new call in the same process, as in
    a notebook or the tests, may run in the same folder again). A folder the lock created that is still empty (the
    run was refused while it set up, e.g. on an unreadable image) is removed, with the empty folders made above it:
    a refusal leaves nothing behind."""
    _PENDING.clear()
    while _HELD:
        fd, made = _HELD.pop()
        os.close(fd)
        for folder in made:  # deepest first
            try:
                folder.rmdir()  # only succeeds while empty
            except OSError:
                break


def _pass_refusal_on(trainer: Trainer) -> None:
    """Make every rank of a multi-process run hear rank 0's refusal of the run folder.

    Only rank 0 takes the lock (the other ranks write into its folder by design). Under srun or torchrun the other
    ranks are processes of their own that cannot see its refusal; they would wait for it in the process group's
    set-up until the group's timeout. So rank 0 joins the group, and the moment the group has formed (the end of
    the strategy's ``setup_environment``, before the logger, the data or any callback has run) it broadcasts its
    refusal, which every rank raises as a ConfigError: one line and exit 2 everywhere, nothing written.

    Every rank of every multi-process run takes part, whoever started the ranks: whether a process started its
    ranks itself (Lightning's launcher, which refuses before it starts them) is only known on each rank after the
    launch, and a broadcast that some ranks skip would pair with another collective (the log folder's broadcast).
    """
    strategy = trainer.strategy
    if not isinstance(vars(strategy).get("setup_environment"), _SetUpThenPassRefusalOn):
        strategy.setup_environment = _SetUpThenPassRefusalOn(strategy)  # type: ignore[method-assign]


class _SetUpThenPassRefusalOn:
    """A strategy's ``setup_environment``, then rank 0's pending refusal broadcast and raised on every rank. A class,
    not a closure, so that a trainer that ``ddp_spawn`` pickles for its processes keeps it."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def __call__(self) -> None:
        type(self.strategy).setup_environment(self.strategy)  # the class's method: this object replaces the instance's
        message = self.strategy.broadcast(_PENDING[0] if _PENDING else None, src=0)
        _PENDING.clear()
        if message:
            raise ConfigError(message)
