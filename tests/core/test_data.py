"""core.data: the seeded-chunk dataset base every paper specialises, and the training loader's epochs."""

from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from lit_icl.core.data import SeededChunks
from lit_icl.core.seeding import derive_seed, make_generator
from lit_icl.core.transfer import to_device


class _Normal(SeededChunks):
    """Chunks of 3 standard normal draws; a fixed training set walks ``i mod 4`` when ``cycle`` is set."""

    def __init__(self, length: int, data_seed: int, stream: tuple, cycle: int | None = None):
        super().__init__(length, data_seed, stream)
        self.cycle = cycle

    def keys(self, index: int) -> tuple[object, ...]:
        return super().keys(index % self.cycle if self.cycle else index)

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        return {"x": torch.randn(3, generator=self.generator(index)), "seed": torch.tensor([self.seed(index)])}


def test_items_are_a_pure_function_of_seed_stream_and_index() -> None:
    a, b = _Normal(8, 5, ("train",)), _Normal(8, 5, ("train",))
    assert len(a) == 8
    assert torch.equal(a[3]["x"], b[3]["x"])  # another instance, same item
    assert torch.equal(a[3]["x"], a[3]["x"])  # asked twice, same item (no shared RNG state)
    assert torch.equal(a[3]["x"], torch.randn(3, generator=make_generator(5, "train", 3)))  # the documented seed
    assert int(a[3]["seed"]) == derive_seed(5, "train", 3)
    assert not torch.equal(a[3]["x"], a[4]["x"])
    assert not torch.equal(a[3]["x"], _Normal(8, 5, ("val",))[3]["x"])  # streams differ
    assert not torch.equal(a[3]["x"], _Normal(8, 6, ("train",))[3]["x"])  # data seeds differ


def test_keys_map_indices() -> None:
    cyc = _Normal(100, 0, ("train",), cycle=4)
    assert torch.equal(cyc[1]["x"], cyc[5]["x"]) and torch.equal(cyc[1]["x"], cyc[97]["x"])
    assert not torch.equal(cyc[1]["x"], cyc[2]["x"])


def _trainer(epoch: int = 0, device: str = "cpu") -> SimpleNamespace:
    """What a data module reads from its trainer: world and rank, the fit loop's epoch, the strategy's device."""
    progress = SimpleNamespace(current=SimpleNamespace(processed=epoch))
    return SimpleNamespace(world_size=1, global_rank=0, fit_loop=SimpleNamespace(epoch_progress=progress),
                           strategy=SimpleNamespace(root_device=torch.device(device)))


def _tiny_icssl(workers: int = 0):
    from lit_icl.icssl import ManifoldDataModule

    return ManifoldDataModule(n_points=12, batch_size=8, chunk_size=4, eval_batch_size=8, val_episodes=8,
                              train_batches_per_epoch=3, train_label_ratio=[0.1, 0.5], eval_label_ratios=[0.25],
                              num_workers=workers)


def _epoch_batches(workers: int, trainer_epoch: int, set_epoch: int | None) -> list[Tensor]:
    """The points of every training batch of a tiny IC-SSL data module attached to a trainer in epoch
    ``trainer_epoch``, iterated as Lightning does on resume: the iterator made before ``set_epoch``."""
    dm = _tiny_icssl(workers)
    dm.trainer = _trainer(trainer_epoch)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)  # workers fetch their first items now
    if set_epoch is not None:
        loader.sampler.set_epoch(set_epoch)
    return [batch["x"] for batch in batches]


def test_a_loader_made_in_a_later_epoch_gives_that_epochs_items_with_workers_too() -> None:
    """On resume Lightning makes the training iterator before it calls ``set_epoch``; workers fetch items as soon
    as the iterator exists. The sampler starts at the trainer's epoch, so two workers give epoch 1's batches,
    those of a loader in the process, not epoch 0's again."""
    epoch1 = _epoch_batches(0, trainer_epoch=1, set_epoch=1)
    epoch0 = _epoch_batches(0, trainer_epoch=0, set_epoch=0)
    with_workers = _epoch_batches(2, trainer_epoch=1, set_epoch=1)
    assert len(with_workers) == 3
    assert all(torch.equal(a, b) for a, b in zip(with_workers, epoch1))
    assert not any(torch.equal(a, b) for a, b in zip(with_workers, epoch0))


def test_persistent_workers_stop_when_the_function_that_iterated_them_returns() -> None:
    """Nothing keeps a finished function's loader alive (lit_icl.core.hparams), so its persistent workers are told
    to stop and joined when it returns. Freed later by a garbage collection instead, the loader's queues close
    before the "stop" is sent, and each worker waits out a 5 s join timeout."""

    def iterate() -> list:
        dm = _tiny_icssl(2)
        dm.setup("fit")
        loader = dm.train_dataloader()
        batches = iter(loader)
        assert len(list(batches)) == 3
        return list(batches._workers)

    gc.disable()  # only reference counting frees what the function leaves
    try:
        workers = iterate()
        assert len(workers) == 2 and not any(w.is_alive() for w in workers)
    finally:
        gc.enable()


def test_loaders_pin_their_batches_for_a_cuda_trainer_only() -> None:
    """A copy to a GPU from pageable memory may wait for the GPU's queue; from pinned memory it does not. So the
    loaders of a data module attached to a CUDA trainer pin (training and evaluation), and nothing else does."""
    dm = _tiny_icssl()
    dm.setup("fit")
    assert not dm.train_dataloader().pin_memory  # no trainer: a script iterating the loader itself
    dm.trainer = _trainer(device="cpu")
    assert not dm.train_dataloader().pin_memory and not dm.val_dataloader().pin_memory
    dm.trainer = _trainer(device="cuda")
    assert dm.train_dataloader().pin_memory and dm.val_dataloader().pin_memory


def test_to_device_is_plain_to_off_cuda() -> None:
    """Off CUDA, :func:`to_device` is ``Tensor.to`` (the tensor itself on its own device; nothing is pinned, which a
    machine without a GPU refuses); on CUDA the values arrive unchanged."""
    t = torch.arange(6.0)
    assert to_device(t, "cpu") is t and to_device(t, torch.device("cpu")) is t
    if torch.cuda.is_available():  # the CUDA branch: pinned, then queued; the values arrive unchanged
        assert torch.equal(to_device(t, "cuda").cpu(), t)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_suite.py runs it)")
def test_to_device_copies_from_pinned_memory_and_the_profiler_tells_them_apart() -> None:
    """On CUDA, :func:`to_device` copies from pinned memory; a plain ``.to`` from pageable memory shows up as such
    in the profiler, which is how the ``cuda`` step test finds pageable copies in a training step."""
    x = torch.randn(40_000)
    kinds = {}
    senders = {"plain": lambda: x.to("cuda", non_blocking=True), "to_device": lambda: to_device(x, "cuda")}
    for name, send in senders.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            sent = send()
            torch.cuda.synchronize()
        kinds[name] = {e.name for e in prof.events() if e.name.startswith("Memcpy HtoD")}
        assert torch.equal(sent.cpu(), x)
    assert any("Pageable" in k for k in kinds["plain"]), kinds
    assert kinds["to_device"] and not any("Pageable" in k for k in kinds["to_device"]), kinds


def _ic_ssl_args(root: Path, *extra: str) -> list[str]:
    """Three 3-step epochs of tiny IC-SSL with two DataLoader workers and its cosine schedule, which reads
    ``trainer.estimated_stepping_batches``: Lightning then makes the training loader before it restores a
    checkpoint, and does not hand the loader its saved position itself."""
    from icssl.helpers import tiny_args

    return tiny_args(root, "--trainer.max_epochs", "3", "--data.init_args.num_workers", "2", *extra)


def _last(root: Path) -> dict:
    return torch.load(next(root.rglob("last.ckpt")), map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def straight_with_workers(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from lit_icl.cli import main

    root = tmp_path_factory.mktemp("straight")
    main(["fit", *_ic_ssl_args(root)])
    return _last(root)


@pytest.mark.parametrize(("stop", "position"), [(3, {"epoch": 1, "batches": 0}), (4, {"epoch": 1, "batches": 1})])
def test_a_run_stopped_and_resumed_with_workers_ends_bit_identical(
    straight_with_workers: dict, tmp_path: Path, stop: int, position: dict
) -> None:
    """Stopped after its first epoch, or inside its second (as ``--trainer.max_time`` stops a run), and resumed with
    ``--ckpt_path last``, an IC-SSL run with two persistent DataLoader workers ends with the weights of the run
    that was not stopped: the workers, handed the first epoch's items before the checkpoint is restored, start
    over from the saved position."""
    from lit_icl.cli import main

    callback = f'[{{"class_path": "subprocess_callbacks.StopAtStep", "init_args": {{"step": {stop}}}}}]'
    main(["fit", *_ic_ssl_args(tmp_path, "--trainer.callbacks", callback)])
    assert _last(tmp_path)["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [position]
    main(["fit", *_ic_ssl_args(tmp_path), "--ckpt_path", "last"])
    states = [straight_with_workers, _last(tmp_path)]
    assert states[0]["global_step"] == states[1]["global_step"] == 9
    assert all(torch.equal(states[0]["state_dict"][k], states[1]["state_dict"][k]) for k in states[0]["state_dict"])


def test_overfit_batches_still_trains_through_the_resumable_loader(tmp_path: Path) -> None:
    """Lightning's ``overfit_batches`` rebuilds the training loader with a sequential sampler: the resumable loader
    takes it, and the run trains its 2 batches an epoch."""
    from icssl.helpers import tiny_args

    from lit_icl.cli import main

    main(["fit", *tiny_args(tmp_path, "--trainer.overfit_batches", "2", "--trainer.max_epochs", "2")])
    assert _last(tmp_path)["global_step"] == 4


def test_what_a_resume_may_change_names_arguments_of_each_data_module() -> None:
    """Every name in a data module's ``free_on_resume`` (its own and its bases') is one of its constructor's
    arguments, so a misspelt name cannot leave an option checked that was meant to be free; the shared ones are
    there for every chunked module."""
    import inspect

    from lit_icl.coqe import RegressionDataModule
    from lit_icl.coqe.omniglot.data import OmniglotSequenceDataModule
    from lit_icl.core.data import ChunkedDataModule, args_free_on_resume
    from lit_icl.i2cl.data import I2CLDataModule
    from lit_icl.icssl import ManifoldDataModule
    from lit_icl.icssl.features import FeatureEpisodeDataModule
    from lit_icl.icssl.image_manifolds import ImageManifoldDataModule
    from lit_icl.mmca.avmnist.data import AVMNISTDataModule
    from lit_icl.mmca.synthetic.data import LatentFactorDataModule

    classes = [RegressionDataModule, OmniglotSequenceDataModule, I2CLDataModule, ManifoldDataModule,
               FeatureEpisodeDataModule, ImageManifoldDataModule, AVMNISTDataModule, LatentFactorDataModule]
    for cls in classes:
        arguments = {name for base in cls.__mro__ if "__init__" in vars(base)
                     for name in inspect.signature(base.__init__).parameters}
        free = args_free_on_resume(cls)
        assert free and free <= arguments, (cls.__name__, sorted(free - arguments))
        if issubclass(cls, ChunkedDataModule):
            assert {"num_workers", "eval_batch_size"} <= free
    assert args_free_on_resume(ManifoldDataModule) >= {"test_manifolds", "num_workers"}
    assert "train_manifolds" not in args_free_on_resume(ManifoldDataModule)
    assert {"root", "build_standin"} <= args_free_on_resume(ImageManifoldDataModule)


@pytest.mark.parametrize(("length", "world"), [(7, 2), (10, 3), (6, 3), (5, 5), (1, 1), (9, 1)])
def test_eval_shards_score_every_item_once_over_the_ranks(length: int, world: int) -> None:
    """Lightning's DistributedSampler pads the last shards with items from the start (scored twice); EvalShards
    hands each item to exactly one rank, at most one item more on some ranks, and is the set in order alone."""
    from torch.utils.data import DistributedSampler

    from lit_icl.core.data import EvalShards

    shards = [list(EvalShards(length, world, rank)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(length))
    assert [len(EvalShards(length, world, rank)) for rank in range(world)] == [len(s) for s in shards]
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert all(shard == sorted(shard) for shard in shards)
    padded = [list(DistributedSampler(range(length), world, rank, shuffle=False)) for rank in range(world)]
    assert sum(map(len, padded)) == -(-length // world) * world  # what it replaces: padded where uneven


def test_eval_shards_refuse_fewer_items_than_ranks() -> None:
    from lit_icl.core.data import EvalShards
    from lit_icl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="^3 test batches cannot give each of 4 DDP ranks one$"):
        EvalShards(3, 4, 0, what="test batches")


def test_an_evaluation_set_of_one_chunk_is_named_in_the_singular() -> None:
    """The DDP refusal of an evaluation set that ranks cannot share reads "1 chunk of 16", not "1 chunks"."""
    from lit_icl.core.errors import ConfigError
    from lit_icl.icssl import ManifoldDataModule

    dm = ManifoldDataModule(batch_size=16, val_episodes=16, test_episodes=32)
    with pytest.raises(ConfigError, match=r"val_episodes=16 is 1 chunk of 16, which 2 ranks cannot share evenly"):
        dm.check_eval_shards(2, ("val",))
    with pytest.raises(ConfigError, match=r"test_episodes=32 is 2 chunks of 16, which 3 ranks"):
        dm.check_eval_shards(3, ("test",))
