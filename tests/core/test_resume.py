"""core.resume and the resumable training loader: a run's data position, cut epochs, and the skip on resume.

The end-to-end checks (runs stopped inside an epoch and resumed end bit-identical) are in
``tests/test_reproducibility.py`` and ``tests/coqe/omniglot/test_cli.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_icl.core.data import EpochSampler, ResumableLoader
from lit_icl.core.resume import record_cut_epoch_unfinished, training_position

PER_EPOCH = 3  # training batches per epoch of the fake trainers below


def fake_trainer(ready: int, started: int, processed: int, completed: int, batches: int) -> SimpleNamespace:
    """A trainer with Lightning's fit-loop counters: epochs ``ready/started/processed/completed``, ``batches``
    trained in the current epoch, :data:`PER_EPOCH` batches an epoch."""
    epochs = SimpleNamespace(ready=ready, started=started, processed=processed, completed=completed)
    fit_loop = SimpleNamespace(
        epoch_progress=SimpleNamespace(current=epochs),
        epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(processed=batches))),
    )
    return SimpleNamespace(fit_loop=fit_loop, num_training_batches=PER_EPOCH, world_size=1, global_rank=0)


def checkpoint_of(trainer: SimpleNamespace) -> dict:
    counts = vars(trainer.fit_loop.epoch_progress.current)
    return {"loops": {"fit_loop": {"epoch_progress": {"total": dict(counts), "current": dict(counts)}}}}


@pytest.mark.parametrize(
    ("counters", "position"),
    [
        ((0, 0, 0, 0, 0), (0, 0)),  # before the first batch
        ((2, 2, 1, 1, 2), (1, 2)),  # inside epoch 1 after 2 batches (a save at a batch's end or a validation)
        ((2, 2, 1, 1, 3), (2, 0)),  # inside epoch 1 after its last batch: epoch 2 is next
        ((2, 2, 2, 1, 3), (2, 0)),  # epoch-end hooks of a whole epoch 1: epoch 2 is next
        ((2, 2, 2, 2, 3), (2, 0)),  # the end of training after whole epochs
        ((2, 2, 2, 1, 2), (1, 2)),  # epoch-end hooks of epoch 1, cut after 2 batches (max_time, max_steps)
        ((2, 2, 2, 2, 2), (1, 2)),  # the end of training after that cut
    ],
)
def test_training_position_reads_lightnings_counters(counters: tuple, position: tuple) -> None:
    assert training_position(fake_trainer(*counters)) == position


def test_a_cut_epoch_is_recorded_as_lightnings_mid_epoch_checkpoint() -> None:
    """After a cut the epoch counts started but not processed (Lightning's `RESTARTED_MID_EPOCH`: started ==
    ready, processed == started - 1, completed == processed); other checkpoints are left as they are."""
    for counters in [(2, 2, 2, 1, 2), (2, 2, 2, 2, 2)]:  # epoch-end hooks, end of training
        trainer = fake_trainer(*counters)
        checkpoint = checkpoint_of(trainer)
        assert record_cut_epoch_unfinished(trainer, checkpoint)
        for counts in checkpoint["loops"]["fit_loop"]["epoch_progress"].values():
            assert counts == {"ready": 2, "started": 2, "processed": 1, "completed": 1}
    for counters in [(2, 2, 1, 1, 2), (2, 2, 1, 1, 3), (2, 2, 2, 1, 3), (2, 2, 2, 2, 3), (0, 0, 0, 0, 0)]:
        trainer = fake_trainer(*counters)
        checkpoint = checkpoint_of(trainer)
        assert not record_cut_epoch_unfinished(trainer, checkpoint)
        assert checkpoint == checkpoint_of(trainer)


def test_the_sampler_skips_a_ranks_first_items_once_and_only_in_that_epoch() -> None:
    one = EpochSampler(12)
    one.set_epoch(1)
    one.resume(1, 5)
    assert list(one) == list(range(17, 24))
    assert list(one) == list(range(12, 24))  # the next pass over the epoch is whole
    ranks = [EpochSampler(12, 2, r) for r in (0, 1)]
    for r, sampler in enumerate(ranks):
        sampler.set_epoch(1)
        sampler.resume(1, 2)  # this rank's first 2 items
        assert list(sampler) == list(range(12 + 4 + r, 24, 2))
    later = EpochSampler(12)
    later.resume(1, 5)
    later.set_epoch(2)  # the restored loops went on to epoch 2: the skip lapses
    assert list(later) == list(range(24, 36))
    later.set_epoch(1)
    assert list(later) == list(range(12, 24))


class _Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


def _loader(trainer: SimpleNamespace | None, workers: int = 0) -> ResumableLoader:
    datamodule = SimpleNamespace(trainer=trainer)
    return ResumableLoader(_Items(), batch_size=2, sampler=EpochSampler(2 * PER_EPOCH), num_workers=workers,
                           persistent_workers=workers > 0, datamodule=datamodule)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_given_a_saved_position_yields_the_rest_of_that_epoch(workers: int) -> None:
    """The state of a loader in epoch 1 after 2 of its 3 batches; a fresh loader that gets it yields batch 3 of
    epoch 1, then whole epochs. Its iterator is made first, as Lightning makes it before restoring a checkpoint
    when the module's optimizer setup asks for the loader: persistent workers have been handed epoch 0's items
    by then and start over."""
    saved = _loader(fake_trainer(2, 2, 1, 1, 2)).state_dict()
    assert saved == {"epoch": 1, "batches": 2}
    resumed = _loader(None, workers)
    iterator = iter(resumed)
    resumed.load_state_dict(saved)
    assert [b.flatten().tolist() for b in iterator] == [[10, 11]]
    resumed.sampler.set_epoch(2)
    assert [b.flatten().tolist() for b in resumed] == [[12, 13], [14, 15], [16, 17]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_position_at_an_epoch_boundary_gives_the_next_epoch_whole(workers: int) -> None:
    saved = _loader(fake_trainer(2, 2, 2, 1, PER_EPOCH)).state_dict()  # the end of a whole epoch 1
    assert saved == {"epoch": 2, "batches": 0}
    resumed = _loader(None, workers)
    iterator = iter(resumed)  # made before the checkpoint is restored, in epoch 0
    resumed.load_state_dict(saved)
    assert [b.flatten().tolist() for b in iterator] == [[12, 13], [14, 15], [16, 17]]


def test_a_loader_whose_sampler_lightning_replaced_ignores_the_position() -> None:
    loader = ResumableLoader(_Items(), batch_size=2, sampler=torch.utils.data.SequentialSampler(range(4)),
                             datamodule=SimpleNamespace(trainer=None))
    loader.load_state_dict({"epoch": 1, "batches": 1})
    assert [b.flatten().tolist() for b in loader] == [[0, 1], [2, 3]]


# ------------------------------------------------------------------ a finished epoch's checkpoint, end to end
def _fit_steps(root, steps: int, *extra: str) -> None:
    """A tiny CoQE regression fit bounded by ``max_steps`` (as every config is), 3 batches an epoch, every
    epoch's checkpoint kept."""
    from coqe.regression.helpers import overlay, reg_args

    from lit_icl.cli import main

    main(["fit", *reg_args(root, overlay("cpu"), "--data.init_args.train_batches_per_epoch", "3",
                           "--checkpoint.save_top_k", "-1", "--trainer.max_steps", str(steps)), *extra])


def _last(root) -> dict:
    return torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """9 steps (3 epochs) without a stop."""
    root = tmp_path_factory.mktemp("straight")
    _fit_steps(root, 9)
    return root


@pytest.mark.parametrize("resume", ["epoch_file", "sittings"])
def test_a_run_resumed_from_a_finished_epochs_checkpoint_ends_bit_identical(tmp_path, straight, resume) -> None:
    """Lightning restarts a step-bounded run from a checkpoint written at an epoch's end "on the epoch's end",
    counts that epoch twice and would feed every later epoch the data of the one after it (all weights differed);
    ``ResumeInsideEpoch`` resumes it at the next epoch, as Lightning does under ``max_epochs``. Both ways in: the
    first epoch's own checkpoint, and a run stopped by ``max_steps`` exactly at an epoch's end, resumed with
    ``last``. The loop counters saved at the end are the straight run's too."""
    if resume == "epoch_file":
        _fit_steps(tmp_path, 9, "--ckpt_path",
                   str(straight / "runs/tiny/version_0/checkpoints/epoch=0-step=3.ckpt"))
    else:
        _fit_steps(tmp_path, 3)
        _fit_steps(tmp_path, 9, "--ckpt_path", "last")
    want, got = _last(straight), _last(tmp_path)
    assert got["global_step"] == 9
    assert want["state_dict"].keys() == got["state_dict"].keys()
    assert all(torch.equal(want["state_dict"][k], got["state_dict"][k]) for k in want["state_dict"])
    assert got["loops"]["fit_loop"]["epoch_progress"] == want["loops"]["fit_loop"]["epoch_progress"]


# ----------------------------------------------------------------------------------------------------------
# The DDP rank count on resume, for a Trainer driven from Python (the CLI's refusal: tests/test_bad_input_cli.py)
# ----------------------------------------------------------------------------------------------------------
def _fit_parts(tmp_path, kind: str, steps: int = 4) -> tuple:
    """A quiet trainer of ``steps`` steps that writes nothing itself, a module and its data: a tiny CoQE regression
    module (``kind="icl_module"``), or Lightning's BoringModel run with ResumeInsideEpoch (``"callback"``), as a user's
    own module under the CLI's callback."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from lit_icl.callbacks import ResumeInsideEpoch
    from lit_icl.coqe import CoQERegressionModule, CoQERegressor, RegressionDataModule

    torch.manual_seed(0)
    if kind == "icl_module":
        module = CoQERegressionModule(CoQERegressor(4, width=16, depth=1, heads=2, max_points=8))
        data = RegressionDataModule("linear", n_dims=4, n_points=8, batch_size=4, chunk_size=4,
                                    train_batches_per_epoch=2, val_prompts=4, test_prompts=4, eval_batch_size=4,
                                    shifts=["id"])
    else:
        module, data = BoringModel(), BoringDataModule()
    trainer = Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      default_root_dir=tmp_path, callbacks=[ResumeInsideEpoch()] if kind == "callback" else [])
    return trainer, module, data


@pytest.mark.parametrize("kind", ["icl_module", "callback"])
def test_a_python_fit_resumed_on_another_number_of_ranks_is_refused_at_load(tmp_path, kind: str) -> None:
    """A 1-rank checkpoint whose record says 2 ranks: ``Trainer.fit(..., ckpt_path=...)`` from Python is refused with
    the CLI's message when Lightning loads it (by every ICLModule, and by ResumeInsideEpoch for other modules), before
    a step; the checkpoint as recorded resumes, and a ``validate`` of the edited one is no resume and is not refused."""
    from lit_icl.core.errors import ConfigError
    from lit_icl.core.resume import RANKS_KEY

    trainer, module, data = _fit_parts(tmp_path, kind)
    trainer.fit(module, data)
    path = tmp_path / "two_ranks.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, map_location="cpu", weights_only=False)
    saved[RANKS_KEY] = 2
    torch.save(saved, path)

    trainer, module, data = _fit_parts(tmp_path, kind, steps=6)
    with pytest.raises(ConfigError) as info:
        trainer.fit(module, data, ckpt_path=path)
    assert str(info.value) == (
        f"--ckpt_path {path} was trained on 2 DDP ranks and this run has 1, which a resumed run cannot change "
        "(batch_size and the data position are per rank, so it would train on other batches while its config.yaml "
        "says the whole run did); resume with --trainer.devices x --trainer.num_nodes = 2, or start a new run without "
        "--ckpt_path")
    assert trainer.global_step == 0

    trainer, module, data = _fit_parts(tmp_path, kind)
    trainer.validate(module, data, ckpt_path=path, verbose=False)
    saved[RANKS_KEY] = 1
    torch.save(saved, path)
    trainer, module, data = _fit_parts(tmp_path, kind, steps=6)
    trainer.fit(module, data, ckpt_path=path)
    assert trainer.global_step == 6
