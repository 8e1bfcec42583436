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


def lock_run_folder(trainer: Trainer) -> Path | None:
    """Lock the run's folder (the logger's ``log_dir``, created if new) for this process, or refuse the run in
    one line when another process holds it. Only global rank 0 locks: the other ranks of a DDP run write into
    rank 0's folder by design. A file system without ``flock`` (some network mounts) leaves the run unlocked."""
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
        raise ConfigError(
            f"the run folder {folder} is in use by another lit_icl process (the same run started twice, or two runs "
            "given one --trainer.logger.init_args.version); wait for it to end, or give this run another version"
        ) from None
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
    while _HELD:
        fd, made = _HELD.pop()
        os.close(fd)
        for folder in made:  # deepest first
            try:
                folder.rmdir()  # only succeeds while empty
            except OSError:
                break
