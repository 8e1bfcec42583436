"""``RunCheckpoint``: Lightning's ``ModelCheckpoint`` that keeps a run resumable after its folder is moved.

A checkpoint records the absolute folder it was saved to (``dirpath``) and the paths of ``last.ckpt`` and the
kept top-k files. ``ModelCheckpoint.load_state_dict`` restores that bookkeeping only when the folder is still
the same path; a run folder copied to another disk (or a results tree renamed) and resumed in place with
``--ckpt_path last`` therefore forgets its own files: ``last.ckpt`` looks like a stranger's, so the run writes
``last-v1.ckpt`` beside it and leaves ``last.ckpt`` at the old step, and the old top-k file is never deleted.
A later ``--ckpt_path last`` would then resume from the stale file.

Here, when the recorded files are present *by name* in this callback's folder (the folder was moved, not
replaced), their paths are rewritten to it and restored; otherwise Lightning's rule applies unchanged.

It writes ``last.ckpt`` at every epoch's save point and at the end of training whatever the top-k settings
(``save_top_k: 0``, ``every_n_train_steps``), where Lightning writes it only beside a top-k file, and again after a
validation round that came after its last save (with ``every_n_train_steps`` the last step is saved before the
epoch's round).

It also writes ``last.ckpt`` when SIGTERM or Ctrl-C (:class:`~lit_icl.callbacks.StopOnCtrlC`) stops a fit between
two training batches (Lightning saves nothing then),
so a preempted run resumes from the step it reached, exactly as if it had not stopped; a run whose loaders resume
exactly only at an epoch's start (a user's module with a plain DataLoader) keeps its last epoch's checkpoint instead.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_icl.callbacks.interrupt import stopped_by_ctrl_c
from lit_icl.callbacks.resume import resumes_inside_epoch
from lit_icl.core.errors import ConfigError


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose state survives moving the run folder (same arguments as Lightning's, less
    ``save_on_exception``, which is refused: see ``__init__``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Lightning's save_on_exception writes a checkpoint and last.ckpt at any exception: inside a validation
        # round, between two epochs (counted complete: the resumed run skips an epoch), or with the weights a
        # non-finite loss left. on_exception below saves only where a run resumes exactly, so the option would be
        # silently ignored (it was); refused instead, with what to use.
        if kwargs.get("save_on_exception"):
            raise ConfigError(
                "--checkpoint.save_on_exception true is not supported: a checkpoint written at a crash may hold a "
                "half-done validation round or the state that failed; SIGTERM and Ctrl-C already save last.ckpt at "
                "the step reached, and --checkpoint.every_n_train_steps N bounds what a crash loses to N steps")
        super().__init__(*args, **kwargs)

    @property
    def state_key(self) -> str:
        # Saved under ModelCheckpoint's key, so checkpoints written before this class existed (and after) resume
        # with their bookkeeping: Lightning matches a callback's saved state by this key.
        # Lightning also reads the key at every hook call (it names the profiler's action), about 60 times a
        # training step, and ModelCheckpoint's is the repr of its trigger settings: so it is made again only
        # when one of those settings has changed.
        settings = (self.monitor, self.mode, self._every_n_train_steps, self._every_n_epochs,
                    self._train_time_interval)
        cached = self.__dict__.get("_state_key_of")
        if cached is None or cached[0] != settings:
            cached = (settings, "ModelCheckpoint" + super().state_key.removeprefix(type(self).__qualname__))
            self._state_key_of = cached
        return cached[1]

    # Lightning 2.6 writes last.ckpt only where it also keeps a top-k file: never per epoch with save_top_k: 0 (I2CL's
    # configs), only every N steps with every_n_train_steps (which turns its per-epoch saves off), and at the end of
    # training only if it never wrote one. So a stopped run could lose all its epochs, or the steps since the last
    # multiple of N. Here last.ckpt is also written at every save point of an epoch Lightning passes over, and at the
    # end of training when it is behind.
    # "Behind" means fewer steps, or fewer validation rounds: a round after the last step's save (every_n_train_steps
    # saves at the batch's end, before the epoch's round) changes what the checkpoint holds (the round's metrics,
    # early stopping's count, a module's per-epoch history), though not the weights.
    def _save_last_checkpoint(self, trainer: Any, monitor_candidates: dict[str, Any]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_saved_at = self._progress(trainer)

    def _progress(self, trainer: Any) -> tuple[int, int]:
        return trainer.global_step, self.__dict__.get("_rounds", 0)

    def _write_last_if_behind(self, trainer: Any) -> None:
        if self.save_last and self.__dict__.get("_last_saved_at") != self._progress(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        due = not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer)
        super().on_train_epoch_end(trainer, pl_module)
        if due:
            self._write_last_if_behind(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._rounds = self.__dict__.get("_rounds", 0) + 1
        due = not self._should_skip_saving_checkpoint(trainer) and not self._should_save_on_train_epoch_end(trainer)
        super().on_validation_end(trainer, pl_module)
        if due:
            self._write_last_if_behind(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # Lightning 2.6 writes last.ckpt at the end of training even under fast_dev_run, which promises no
        # checkpoint; there the logger is off, so the file landed in ./checkpoints/ of the working folder.
        if trainer.fast_dev_run:
            return
        super().on_train_end(trainer, pl_module)
        self._write_last_if_behind(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # SIGTERM (a preemption, scancel, docker stop) ends a fit between two training batches: write last.ckpt
        # there, so that --ckpt_path last resumes from that step rather than from the last epoch's checkpoint.
        # Not during a validation round (Lightning stops inside one on SIGTERM, except in a fit, where
        # FinishRoundOnSigterm holds the signal until the round ends): the state there is half a round;
        # nor for a run whose loaders resume exactly only at an epoch's start (a plain DataLoader).
        # Nor between two epochs (Lightning's fit loop raises it after counting the epoch complete): a checkpoint
        # written there counts the epoch complete, unlike the one this callback wrote at the epoch's save point,
        # and a run resumed from it skipped an epoch (its steps, then the next epoch's data). last.ckpt already
        # holds that save point.
        if (isinstance(exception, SIGTERMException) and self.save_last and resumes_inside_epoch(trainer)
                and not (trainer.fast_dev_run or trainer.sanity_checking or trainer.validating)):
            asked_by = "Ctrl-C" if stopped_by_ctrl_c() else "SIGTERM"
            epochs = trainer.fit_loop.epoch_progress.current
            if epochs.completed == epochs.ready:  # between epochs
                if self.__dict__.get("_last_saved_at", (None,))[0] == trainer.global_step:
                    rank_zero_info(f"{asked_by}: {self.last_model_path} holds step {trainer.global_step}, the "
                                   "epoch's end")
                return
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            rank_zero_info(f"{asked_by}: saved {self.last_model_path} at step {trainer.global_step}")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._stage = stage

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old = state_dict.get("dirpath")
        if old and self.dirpath and old != self.dirpath and self._moved_here(state_dict):
            state_dict = self._relocated(state_dict, Path(old), Path(self.dirpath))
        if self.__dict__.get("_stage", "fit") == "fit" and rank_zero_only.rank == 0:
            super().load_state_dict(state_dict)
            return
        # Lightning warns that a checkpoint from another folder brings only its best_model_path. A test, validate
        # or predict of a checkpoint (always in a folder of its own) saves nothing, so that is no news there; and
        # under DDP rank 0 says it once rather than every rank.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The dirpath has changed")
            super().load_state_dict(state_dict)

    def _moved_here(self, state: dict[str, Any]) -> bool:
        """Whether the files the checkpoint recorded under its folder all exist under this callback's folder."""
        names = [Path(p).name for p in self._recorded_paths(state)]
        return bool(names) and all((Path(self.dirpath) / name).is_file() for name in names)

    @staticmethod
    def _recorded_paths(state: dict[str, Any]) -> list[str]:
        old = Path(state["dirpath"])
        paths = [state.get("last_model_path"), state.get("best_model_path"), state.get("kth_best_model_path"),
                 *(state.get("best_k_models") or {})]
        return [p for p in paths if p and Path(p).parent == old]

    @staticmethod
    def _relocated(state: dict[str, Any], old: Path, new: Path) -> dict[str, Any]:
        def move(path: Any) -> Any:
            return str(new / Path(path).name) if path and Path(path).parent == old else path

        state = dict(state)
        for key in ("last_model_path", "best_model_path", "kth_best_model_path"):
            if key in state:
                state[key] = move(state[key])
        if state.get("best_k_models"):
            state["best_k_models"] = {move(path): score for path, score in state["best_k_models"].items()}
        state["dirpath"] = str(new)
        return state
