"""``RunCheckpoint`` writes ``last.ckpt`` at every epoch's save point and at the end of training, whatever its
top-k settings: Lightning 2.6 writes it only beside a top-k file, so with ``save_top_k: 0`` (I2CL's configs) a run
had no ``last.ckpt`` until it finished, and with ``every_n_train_steps`` only every N steps. Every CLI trainer writes
its checkpoints atomically (``AtomicCheckpointIO``): a save cut short by a full disk keeps the earlier file, and
the run ends with one line and status 74."""

from __future__ import annotations

import os

import pytest
import torch
from coqe.regression.helpers import overlay, reg_args
from lightning.pytorch import Callback, LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI


class LastAtEpochStart(Callback):
    """The step of ``last.ckpt`` as each training epoch starts (``None`` before there is one)."""

    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        path = trainer.checkpoint_callback.last_model_path
        self.seen.append(torch.load(path, weights_only=True)["global_step"] if path else None)


@pytest.mark.parametrize("setting", [["--checkpoint.save_top_k", "0"], ["--checkpoint.every_n_train_steps", "7"]],
                         ids=["save_top_k_0", "every_7_steps"])
def test_last_is_written_at_every_epoch_end_and_at_the_last_step(tmp_path, setting: list[str]) -> None:
    args = reg_args(tmp_path, overlay("cpu"), "--data.init_args.train_batches_per_epoch", "5",
                    "--trainer.max_steps", "12", *setting)
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    spy = LastAtEpochStart()
    cli.trainer.callbacks.append(spy)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert spy.seen == [None, 5, 10]  # epochs of 5 steps
    last = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 12  # the steps after the last epoch's end are not lost


class RoundCounter(Callback):
    """Counts validation rounds, in the checkpoints (a stateful callback, as early stopping is)."""

    def __init__(self) -> None:
        self.rounds = 0

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.rounds += 1

    def state_dict(self) -> dict[str, int]:
        return {"rounds": self.rounds}


def test_last_written_every_n_steps_is_written_again_after_the_round_that_follows_it(tmp_path) -> None:
    """With ``every_n_train_steps`` the last step is saved at its batch's end, before the epoch's validation round:
    ``last.ckpt`` is written again after the round, so it holds what the round changed (callbacks' state, the
    module's per-epoch records), as it does without the setting."""
    args = reg_args(tmp_path, overlay("cpu"), "--data.init_args.train_batches_per_epoch", "5",
                    "--trainer.max_steps", "10", "--checkpoint.every_n_train_steps", "5")
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    counter = RoundCounter()
    cli.trainer.callbacks.append(counter)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    last = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=True)
    assert counter.rounds == 2 and last["global_step"] == 10
    assert last["callbacks"]["RoundCounter"] == {"rounds": 2}


# Checkpoint files written atomically (lit_icl.core.checkpoint_io): a save cut short by a full disk leaves the
# earlier file as it was, and the CLI ends such a run with one line.

def _checkpoint(step: int) -> dict:
    return {"state_dict": {"w": torch.arange(50_000, dtype=torch.float32) + step}, "global_step": step}


def _fail_midway(monkeypatch) -> None:
    """Make every checkpoint write stop with ENOSPC after half its bytes, as a full disk does."""
    import errno

    from lit_icl.core.checkpoint_io import AtomicCheckpointIO

    real = AtomicCheckpointIO._write_bytes

    def half_then_full(fd: int, data: memoryview) -> None:
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(AtomicCheckpointIO, "_write_bytes", staticmethod(half_then_full))


def test_a_save_writes_a_file_torch_load_reads_and_leaves_nothing_else(tmp_path) -> None:
    from lit_icl.core.checkpoint_io import AtomicCheckpointIO

    target = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(_checkpoint(3), target)
    AtomicCheckpointIO().save_checkpoint(_checkpoint(4), target)  # over an existing file
    loaded = torch.load(target, weights_only=True)
    assert loaded["global_step"] == 4 and torch.equal(loaded["state_dict"]["w"], _checkpoint(4)["state_dict"]["w"])
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_a_save_removes_what_a_killed_writer_left_and_keeps_a_live_writers_file(tmp_path) -> None:
    """A process killed outright mid-save leaves its temporary file (as large as a checkpoint); the next save of the
    same file removes it, but not the file of a writer that still runs, nor another checkpoint's."""
    import subprocess
    import sys

    from lit_icl.core.checkpoint_io import AtomicCheckpointIO

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    dead = folder / f".last.ckpt.{int(gone.stdout)}.0a1b2c3d.tmp"
    live = folder / f".last.ckpt.{os.getppid()}.0a1b2c3d.tmp"
    other = folder / f".best.ckpt.{int(gone.stdout)}.0a1b2c3d.tmp"
    for stale in (dead, live, other):
        stale.write_bytes(b"PK\x03\x04 cut short")
    AtomicCheckpointIO().save_checkpoint(_checkpoint(3), folder / "last.ckpt")
    assert sorted(p.name for p in folder.iterdir()) == sorted(["last.ckpt", live.name, other.name])


def test_a_save_that_fails_midway_leaves_the_earlier_checkpoint_byte_identical(tmp_path, monkeypatch) -> None:
    import errno

    from lit_icl.core.checkpoint_io import AtomicCheckpointIO
    from lit_icl.core.errors import StorageError

    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(_checkpoint(3), target)
    before = target.read_bytes()
    _fail_midway(monkeypatch)
    with pytest.raises(StorageError) as info:
        AtomicCheckpointIO().save_checkpoint(_checkpoint(4), target)
    assert target.read_bytes() == before  # Lightning's save left the first half of the new file here
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file
    assert info.value.__cause__.errno == errno.ENOSPC
    assert str(info.value) == (
        f"could not write the checkpoint {target}: the disk is full (ENOSPC); last.ckpt is unchanged; free space on "
        f"the disk of {tmp_path}, then resume with --ckpt_path last (the earlier last.ckpt is complete)")
    with pytest.raises(StorageError, match="was not created; .* then run the same command again"):
        AtomicCheckpointIO().save_checkpoint(_checkpoint(4), tmp_path / "elsewhere" / "last.ckpt")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_every_cli_trainer_writes_atomically_and_a_plugin_of_ones_own_is_kept(tmp_path) -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    from lit_icl.cli.trainer_setup import use_atomic_checkpoint_io
    from lit_icl.core.checkpoint_io import AtomicCheckpointIO

    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=reg_args(tmp_path, overlay("cpu")))
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO

    class Mine(TorchCheckpointIO):
        pass

    trainer = Trainer(plugins=[Mine()], logger=False, enable_checkpointing=False, accelerator="cpu")
    use_atomic_checkpoint_io(trainer)
    assert type(trainer.strategy.checkpoint_io) is Mine
    trainer = Trainer(plugins=[AsyncCheckpointIO()], logger=False, enable_checkpointing=False, accelerator="cpu")
    use_atomic_checkpoint_io(trainer)  # a wrapper without a base of its own gets the atomic one as its base
    assert type(trainer.strategy.checkpoint_io.checkpoint_io) is AtomicCheckpointIO


def test_a_full_disk_during_fit_is_one_line_exit_74_and_last_ckpt_stays_complete(tmp_path, capsys,
                                                                                 monkeypatch) -> None:
    """The second epoch's save hits a full disk: the run ends with one line naming the file, the cause and the
    resume (exit status 74, not a traceback), and ``last.ckpt`` still holds the first epoch."""
    from lit_icl.cli import main
    from lit_icl.core.checkpoint_io import AtomicCheckpointIO

    args = reg_args(tmp_path, overlay("cpu"), "--trainer.max_steps", "4")  # 2 steps an epoch: saves at 2 and 4
    real_save = AtomicCheckpointIO.save_checkpoint

    def full_after_first_epoch(self, checkpoint, path, storage_options=None):
        if checkpoint["global_step"] > 2:
            _fail_midway(monkeypatch)
        real_save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", full_after_first_epoch)
    with pytest.raises(SystemExit) as info:
        main(["fit", *args])
    assert info.value.code == 74
    err = capsys.readouterr().err
    folder = tmp_path / "runs/tiny/version_0/checkpoints"
    lines = [ln for ln in err.splitlines() if ln.startswith("lit_icl: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"lit_icl: error: could not write the checkpoint {folder}/")
    assert "the disk is full (ENOSPC)" in lines[0] and lines[0].endswith("then resume with --ckpt_path last "
                                                                        "(the earlier last.ckpt is complete)")
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 2
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]


def test_sigterm_between_two_epochs_resumes_bit_identical_from_the_epochs_end(tmp_path) -> None:
    """Lightning's fit loop raises a SIGTERM that came during an epoch's end hooks after counting the epoch
    complete. The checkpoint written there counted it complete too, and the resumed run skipped an epoch: it ended
    one epoch further on, having trained on the next epoch's data (IC-SSL: 12 steps, epoch 12 instead of 11, other
    weights). last.ckpt keeps the epoch's own save point instead."""
    from lit_icl.cli import main

    def fit(run: str, *extra: str) -> None:
        main(["fit", "--config", "configs/icssl/manifolds.yaml", "--data.init_args.train_batches_per_epoch", "1",
              "--data.init_args.batch_size", "16", "--data.init_args.val_episodes", "16",
              "--data.init_args.test_episodes", "16", "--trainer.max_epochs", "100", "--trainer.max_steps", "8",
              "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(tmp_path / run),
              # 20-point episodes and 3 evaluated ratios (0.25 the best-model callback's): what the loop counts is
              # the same at any size, and 100-point ones tripled the test's time
              "--model.init_args.net.init_args.representation.init_args.n_points", "20",
              "--model.init_args.net.init_args.representation.init_args.stack_repeats", "1",
              "--data.init_args.n_points", "20", "--data.init_args.eval_label_ratios", "[0.1, 0.25, 0.5]",
              "--data.init_args.train_label_ratio", "[0.1, 0.5]",
              *extra])

    fit("straight")
    with pytest.raises(SystemExit) as stopped:
        fit("stopped", "--trainer.callbacks+=subprocess_callbacks.SignalAtStep", "--trainer.callbacks.step", "5",
            "--trainer.callbacks.at_epoch_end", "true", "--trainer.callbacks.path", str(tmp_path / "ends.txt"))
    assert stopped.value.code == 143
    last = tmp_path / "stopped/icssl_manifolds/version_0/checkpoints/last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 5
    fit("stopped", "--ckpt_path", "last")
    a = torch.load(tmp_path / "straight/icssl_manifolds/version_0/checkpoints/last.ckpt", weights_only=False)
    b = torch.load(last, weights_only=False)
    assert (a["global_step"], a["epoch"]) == (b["global_step"], b["epoch"]) == (8, 7)
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


@pytest.mark.parametrize("where", ["option", "config_callback"])
def test_save_on_exception_is_refused_not_silently_ignored(tmp_path, capsys, where) -> None:
    """RunCheckpoint saves at an exception only where a run resumes exactly (SIGTERM, Ctrl-C between two training
    batches); Lightning's ``save_on_exception`` was accepted and did nothing, so a crash lost what the user had
    asked to keep. It is refused in one line, with what to use instead."""
    import json

    from badinput import assert_rejected

    extra = (["--checkpoint.save_on_exception", "true"] if where == "option" else
             ["--trainer.callbacks+", json.dumps({"class_path": "lit_icl.callbacks.RunCheckpoint",
                                                  "init_args": {"monitor": "val/mse", "save_on_exception": True}})])
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path), *extra],
                           "--checkpoint.save_on_exception true is not supported")
    assert "--checkpoint.every_n_train_steps" in line


def test_save_on_exception_is_not_offered_in_help(capsys) -> None:
    """The refused option is left out of ``fit --help`` (usage line and option list), while the other
    ``--checkpoint.*`` options stay; passing it is still parsed and refused (the test above)."""
    from lit_icl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "configs/coqe_omniglot.yaml", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--checkpoint.save_top_k" in text and "--checkpoint.every_n_train_steps" in text
    assert "save_on_exception" not in text
