"""Checkpoint files written atomically on local disks, and a failed write as one line instead of a traceback.

Lightning 2.6's ``TorchCheckpointIO`` writes through an fsspec local transaction whose temporary file lives in
the system's temp folder (``/tmp``); committing it is a move, which across file systems (``/tmp`` on one, the run
folder on another: the usual case on clusters and in containers) is a copy onto the target. A copy cut short by a
full disk left a truncated ``last.ckpt`` in place of the complete one before it: the run lost its resume point,
and ``--ckpt_path last`` then failed on the damaged file. :class:`AtomicCheckpointIO` writes the checkpoint to a
temporary file in the target's own folder, flushes and fsyncs it, and ``os.replace`` s it onto the target (an
atomic rename on the same file system); on any failure the temporary file is removed and the file that was at
the target is untouched. A failure that is the environment's (a full disk, a quota, a read-only folder) is raised
as a :class:`~lit_icl.core.errors.StorageError` whose message names the path, the cause and the fix, which
``python -m lit_icl`` prints as one line (exit status :data:`~lit_icl.core.errors.EXIT_STORAGE`).

The CLI gives every trainer it builds this plugin (``lit_icl.cli.app.use_atomic_checkpoint_io``) unless the
config names a checkpoint plugin of its own. Remote paths (``s3://``, any fsspec URL but ``file://``) take
Lightning's path unchanged. Under DDP only rank 0 writes, as Lightning arranges (``Strategy.save_checkpoint``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shlex
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lit_icl.core.errors import StorageError

#: The first bytes of a zip archive, the format ``torch.save`` writes (a checkpoint's end holds its directory).
ZIP_MAGIC = b"PK\x03\x04"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic: a temporary file in the target's folder, flushed and
    fsynced, then renamed onto the target; a save that fails leaves the earlier file as it was and no temporary
    file. A local ``OSError`` is raised as :class:`~lit_icl.core.errors.StorageError` (one line: path, cause,
    fix). See the module docstring for why Lightning's own save is not enough."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if not _is_local_file_protocol(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        if storage_options is not None:  # as TorchCheckpointIO: a plain file has no storage options
            raise TypeError(f"`Trainer.save_checkpoint(..., storage_options=...)` is not supported by "
                            f"{type(self).__name__}; implement a CheckpointIO of your own to use them")
        target = Path(str(path).removeprefix("file://"))
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)  # a checkpoint that cannot be pickled fails here, before the disk is touched
        try:
            save_atomically(buffer.getbuffer(), target, self._write_bytes)
        except OSError as err:
            raise StorageError(save_failed_message(target, err)) from err

    @staticmethod
    def _write_bytes(fd: int, data: memoryview) -> None:
        """Write all of ``data`` to the file descriptor ``fd`` (tests replace it to fail midway)."""
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:written + (64 << 20)])


def save_atomically(data: memoryview | bytes, target: Path, write: Any = None) -> None:
    """Write ``data`` to ``target`` atomically: to a new temporary file in ``target``'s folder (hidden, not a
    ``.ckpt``, so nothing takes it for a checkpoint), fsynced, then renamed onto ``target``; the folder is fsynced
    too where the file system allows, so the rename survives a power cut. On any failure (or an interrupt) the
    temporary file is removed and the exception propagates; ``target`` is then as it was."""
    write = write or AtomicCheckpointIO._write_bytes
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    temporary = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # O_EXCL: never another's file; mode 0o666 less the umask, as a plain open() would give the target.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            write(fd, memoryview(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except BaseException:
        # The error that brought us here is the one to report, not a failure to clean up after it.
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
    _fsync_folder(target.parent)


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove the temporary files of saves of ``target`` whose writer no longer runs (a process killed outright
    mid-save, e.g. SIGKILL after a scheduler's grace period, cannot remove its own): each is as large as a whole
    checkpoint. A writer is known by the pid in the file's name; one still running, or not ours to signal, keeps
    its file. Returns what was removed."""
    removed = []
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        pid = stale.name[len(target.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _process_exists(int(pid)):
            continue
        # Another save may have removed it first, or the folder refuses: the next save tries again.
        with contextlib.suppress(OSError):
            stale.unlink()
            removed.append(stale)
    return removed


def _process_exists(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's counts: it may not be signalled)."""
    try:
        os.kill(pid, 0)  # signal 0 delivers nothing; it only checks
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows, where a folder cannot be opened
        return
    try:
        with contextlib.suppress(OSError):  # some file systems do not sync folders; the file itself is synced
            os.fsync(fd)
    finally:
        os.close(fd)


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a whole zip archive (``torch.save``'s format): its end, which holds the archive's
    directory, is there. A file cut short (a full disk, a killed copy) is not; reading only its end, this is cheap
    for a checkpoint of any size."""
    try:
        return path.is_file() and zipfile.is_zipfile(path)
    except OSError:
        return False


def is_cut_short(path: Path) -> bool:
    """Whether ``path`` looks like a ``torch.save`` file that was cut short or damaged: empty, or starting as a zip
    archive whose directory at the end is missing."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(ZIP_MAGIC))
    except OSError:
        return False
    return head == b"" or (head == ZIP_MAGIC and not is_complete(path))


def complete_checkpoints(folder: Path, besides: Path | None = None) -> list[Path]:
    """The complete ``.ckpt`` files in ``folder`` (not ``besides``), newest first."""
    try:
        found = [p for p in folder.glob("*.ckpt") if besides is None or p.resolve() != besides.resolve()]
        found = [p for p in found if is_complete(p)]
        return sorted(found, key=lambda p: -p.stat().st_mtime)
    except OSError:
        return []


#: What a failed write's errno means, and what to do about it (``{folder}`` is the folder written to).
_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", "free space on the disk of {folder}"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space in your quota on {folder}"),
    errno.EROFS: ("the file system is read-only", "point --trainer.logger.init_args.save_dir at a writable disk"),
    errno.EACCES: ("permission denied", "make {folder} writable"),
}


def save_failed_message(target: Path, err: OSError) -> str:
    """One line for a checkpoint that could not be written: the path, the cause, the fix, and where to resume."""
    folder = target.parent
    cause, fix = _CAUSES.get(err.errno, (err.strerror or str(err) or type(err).__name__, "fix that"))
    cause = f"{cause} ({errno.errorcode.get(err.errno, err.errno)})" if err.errno else cause
    fix = fix.format(folder=folder)
    complete = complete_checkpoints(folder)
    if any(p.name == "last.ckpt" for p in complete):
        then = "then resume with --ckpt_path last (the earlier last.ckpt is complete)"
    elif complete:
        then = f"then resume from the newest complete checkpoint with --ckpt_path {shlex.quote(str(complete[0]))}"
    else:
        then = "then run the same command again (no complete checkpoint of this run was written)"
    kept = " is unchanged" if target.exists() else " was not created"
    return f"could not write the checkpoint {target}: {cause}; {target.name}{kept}; {fix}, {then}"
