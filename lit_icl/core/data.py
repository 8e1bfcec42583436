"""Data plumbing shared by papers whose episodes are generated on the fly.

The pattern: a :class:`SeededChunks` dataset whose item ``i`` is a *chunk* of episodes generated in one vectorised
call from a generator seeded by ``(data_seed, *stream, i)`` (each paper's ``data.py`` subclasses it); training uses
:class:`EpochSampler` so item indices encode the epoch; the DataLoader stacks ``batch_size / chunk_size`` chunks with
:func:`collate_chunks`. :class:`ChunkedDataModule` holds what the data modules built this way share: the checks of
their batch and set sizes, epoch size, seed and workers, the DDP shard of a training epoch and the loaders, so a
paper's data module states only how to make its datasets. :class:`StandinOnFirstUse` is the other shared piece:
a data module whose default location holds an offline stand-in builds it there on first use.
"""

from __future__ import annotations

import fcntl
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from lit_icl.core.errors import ConfigError
from lit_icl.core.memory import DataPiece, check_data_fits
from lit_icl.core.resume import training_position
from lit_icl.core.seeding import derive_seed, make_generator
from lit_icl.core.transfer import pins_memory
from lit_icl.core.validation import check_int


class SeededChunks(Dataset, ABC):
    """``length`` chunks of generated examples; item ``i`` is a pure function of ``(data_seed, *stream, i)``.

    ``stream`` names the split and whatever else tells two datasets of one run apart (``("train",)``,
    ``("test", "sphere")``). A subclass writes :meth:`make_chunk`, drawing only from :meth:`generator` (or from
    :meth:`seed`, when the chunk is generated later on the accelerator), so an item does not depend on workers,
    DDP ranks, batch order or the resume point. :meth:`keys` may map indices (a fixed training set walks
    ``i mod cycle``).
    """

    def __init__(self, length: int, data_seed: int, stream: Sequence[object]):
        self.length = length
        self.data_seed = data_seed
        self.stream = tuple(stream)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return self.make_chunk(int(index))

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Tensor]]:
        """The chunks of a batch (a DataLoader asks for them together): :meth:`make_chunks`."""
        return self.make_chunks([int(i) for i in indices])

    def keys(self, index: int) -> tuple[object, ...]:
        """What seeds item ``index`` after ``data_seed``: the stream, then the index."""
        return (*self.stream, index)

    def seed(self, index: int) -> int:
        return derive_seed(self.data_seed, *self.keys(index))

    def generator(self, index: int) -> torch.Generator:
        return make_generator(self.data_seed, *self.keys(index))

    @abstractmethod
    def make_chunk(self, index: int) -> dict[str, Tensor]:
        """The chunk of item ``index``: a dict of tensors whose first axis is the chunk's episodes."""

    def make_chunks(self, indices: list[int]) -> list[dict[str, Tensor]]:
        """The chunks of ``indices``, each equal to :meth:`make_chunk`'s. A subclass whose chunks cost a few
        small ops each may make them in one pass, as long as every chunk stays a function of its own index."""
        return [self.make_chunk(i) for i in indices]


def collate_chunks(items: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Concatenate chunks along the episode axis: ``batch_size / chunk_size`` items -> one batch."""
    return {k: torch.cat([it[k] for it in items]) for k in items[0]}


class DeviceBank:
    """Tensors that batches index along their first axis (a fixed training set, a feature matrix), moved to the
    training device once: the loaders ship indices, and :meth:`gather` takes the rows there. Gathering is exact,
    so a batch holds bit for bit the values it would hold if gathered on the host.

    Args:
        tensors: ``{key: (N, ...)}``, all indexed by the same row ids.
    """

    def __init__(self, tensors: Mapping[str, Tensor]):
        self._tensors = dict(tensors)

    @classmethod
    def stacked(cls, items: Dataset) -> DeviceBank:
        """A bank of every item ``{key: tensor}`` of ``items`` (a dataset with a length), one row per item."""
        rows = [items[i] for i in range(len(items))]
        return cls({k: torch.stack([row[k] for row in rows]) for k in rows[0]})

    def tensors(self, device: torch.device) -> dict[str, Tensor]:
        """The bank on ``device`` (moved there at the first call; each tensor itself once it is there)."""
        self._tensors = {k: v.to(device) for k, v in self._tensors.items()}
        return self._tensors

    def gather(self, index: Tensor) -> dict[str, Tensor]:
        """``{key: tensor[index]}`` on ``index``'s device, ``index`` of any shape: one ``index_select`` a tensor
        (on our CPU a third of the time of indexing and scaling a 6.5 MB IC-SSL batch the plain way)."""
        return {k: torch.index_select(v, 0, index.flatten()).view(*index.shape, *v.shape[1:])
                for k, v in self.tensors(index.device).items()}


class EpochSampler(DistributedSampler):
    """Global item indices of the current epoch, ``epoch * length + i``, sharded across DDP ranks.

    Lightning calls ``set_epoch`` before every training epoch, which makes training data fresh each epoch
    while keeping it a pure function of the index. Rank ``r`` of ``k`` takes items ``r, r + k, ...`` in order.
    Being a ``DistributedSampler`` it is used as is under DDP (Lightning would otherwise wrap it in a
    *shuffling* distributed sampler), so ``k`` ranks with ``b`` episodes per step see exactly the episodes
    one process sees with ``k * b``.
    """

    def __init__(self, length: int, num_replicas: int = 1, rank: int = 0):
        if length % num_replicas:
            raise ConfigError(f"{length} items per epoch cannot be split evenly over {num_replicas} ranks")
        super().__init__(range(length), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.length = length
        self._resume: tuple[int, int] | None = None

    def resume(self, epoch: int, items: int) -> None:
        """Make the next pass over ``epoch`` start after this rank's first ``items`` items (a mid-epoch resume).

        Applies once: later passes, and passes over other epochs, give whole epochs.
        """
        check_int("items", items, minimum=0)
        self._resume = (epoch, items)

    def __iter__(self) -> Iterator[int]:
        start = self.epoch * self.length
        skip = 0
        if self._resume is not None:
            epoch, items = self._resume
            if epoch == self.epoch:
                skip = items * self.num_replicas  # this rank's items are every num_replicas-th one
                self._resume = None
            elif self.epoch > epoch:
                self._resume = None
        return iter(range(start + self.rank + skip, start + self.length, self.num_replicas))

    def __len__(self) -> int:
        return self.length // self.num_replicas


class EvalShards(DistributedSampler):
    """An evaluation set of ``length`` items over ``num_replicas`` DDP ranks, each item scored exactly once.

    Rank ``r`` takes items ``r, r + k, ...`` in order, so ranks hold at most one item more than each other.
    Lightning's own ``DistributedSampler`` would instead pad the last shards with items from the start, which
    the synced means then count twice. Uneven shards are safe for a module whose evaluation syncs only at the
    epoch's end (torchmetrics' ``compute``, ``self.log`` at the epoch's end): every rank reaches those calls
    whatever its batch count. Every rank needs at least one item (a rank without batches would never create
    or update the metrics that the others sync), so fewer items than ranks is refused.

    Being a ``DistributedSampler``, Lightning uses it as it is; in one process it is the set in order.
    """

    def __init__(self, length: int, num_replicas: int = 1, rank: int = 0, what: str = "items") -> None:
        if length < num_replicas:
            raise ConfigError(f"{length} {what} cannot give each of {num_replicas} DDP ranks one")
        super().__init__(range(length), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.length = length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.num_replicas))


def eval_shards_loader(datamodule: LightningDataModule, dataset: Dataset, batch_size: int, what: str,
                       **kwargs: Any) -> DataLoader:
    """An evaluation loader of ``dataset`` (``what`` its items are, for the refusal) in batches of ``batch_size``,
    each item scored by one DDP rank of ``datamodule``'s trainer (:class:`EvalShards`), pinned for a CUDA run."""
    sampler = EvalShards(len(dataset), *world_and_rank(datamodule), what=what)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pins_memory(datamodule), **kwargs)


def check_eval_units(world_size: int, units: int, what: str, fix: str) -> None:
    """Refuse, before a run starts, an evaluation set that :class:`EvalShards` would cut into fewer ``units``
    (batches or items; ``what`` says how the set is cut) than ``world_size`` DDP ranks: each rank needs one.
    ``fix`` ends the line."""
    if units < world_size:
        raise ConfigError(f"{what}, fewer than the {world_size} DDP ranks that share them; {fix}")


def chunk_loader(
    dataset: Dataset,
    batch_size: int,
    chunk_size: int,
    num_workers: int = 0,
    sampler: Sampler[int] | None = None,
    resumable: LightningDataModule | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """A DataLoader that stacks ``batch_size / chunk_size`` chunks of episodes into one batch, in index order.

    Workers persist across epochs: the sampler runs in the main process and hands them each epoch's indices, so
    they need not be forked again at every epoch (a pause of its own before each epoch's first batch). They
    run one intra-op thread each so they do not oversubscribe the cores. Items draw only from their own seeded
    generators, so no per-worker RNG seeding is needed and the batches are those of ``num_workers=0``.

    With ``resumable`` (the data module of a training loader, whose ``sampler`` is an :class:`EpochSampler`) the
    loader is a :class:`ResumableLoader`. ``pin_memory`` puts each batch in pinned memory, so that its copy to a
    CUDA device does not make the host wait (:mod:`lit_icl.core.transfer`).
    """
    if batch_size % chunk_size:
        raise ConfigError(f"batch_size={batch_size} must be a multiple of chunk_size={chunk_size}")
    extra: dict[str, Any] = {} if resumable is None else {"datamodule": resumable}
    return (DataLoader if resumable is None else ResumableLoader)(
        dataset,
        batch_size=batch_size // chunk_size,
        sampler=sampler,
        shuffle=False,
        collate_fn=collate_chunks,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        worker_init_fn=_single_thread_worker if num_workers > 0 else None,
        pin_memory=pin_memory,
        **extra,
    )


class ResumableLoader(DataLoader):
    """A training loader over an :class:`EpochSampler` that a run resumes inside an epoch.

    Lightning saves a training loader's ``state_dict`` in every checkpoint. The state is the run's data position,
    ``{"epoch", "batches"}`` (:func:`~lit_icl.core.resume.training_position`); on resume ``load_state_dict`` gets it
    back before the first batch is drawn (from Lightning, or from :class:`~lit_icl.callbacks.ResumeInsideEpoch`
    where Lightning does not hand it over), and the first pass over that epoch skips the batches already trained
    on. With that callback (the CLI adds it to every run) a run stopped inside an epoch (``max_time``,
    ``max_steps``) or resumed from a checkpoint written inside one ends bit-identical to a run that never stopped,
    instead of skipping the rest of the epoch or training on its first batches again.

    Args:
        *args, **kwargs: :class:`~torch.utils.data.DataLoader`'s, with an :class:`EpochSampler` as ``sampler``
            (another sampler, such as the one Lightning puts in for ``overfit_batches``, ignores the position).
        datamodule: the data module whose trainer's loop counters give the position.
    """

    def __init__(self, *args: Any, datamodule: LightningDataModule, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.datamodule = datamodule

    def state_dict(self) -> dict[str, int]:
        trainer = self.datamodule.trainer
        epoch, batches = training_position(trainer) if trainer is not None else (self.sampler.epoch, 0)
        return {"epoch": epoch, "batches": batches}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        if not isinstance(self.sampler, EpochSampler):
            return  # Lightning swapped the sampler (``overfit_batches`` walks the same few batches every epoch)
        epoch, batches = int(state_dict["epoch"]), int(state_dict["batches"])
        # Lightning may make the first iterator before it calls set_epoch, so the epoch is set here too.
        self.sampler.set_epoch(epoch)
        self.sampler.resume(epoch, batches * (self.batch_size or 1))
        if self._iterator is not None:
            # Persistent workers were handed their first indices when the iterator was made, which Lightning does
            # before it restores the checkpoint when the module's optimizer setup asks for the loader: start over.
            self._iterator._reset(self)


def _single_thread_worker(worker_id: int) -> None:
    torch.set_num_threads(1)


def check_chunk_sizes(chunk_size: Any, sizes: Mapping[str, Any]) -> int:
    """``chunk_size`` >= 1 and each of ``sizes`` (batch sizes, set sizes) a positive multiple of it, since items are
    whole chunks; one :class:`ConfigError` naming the first that is not. Returns ``chunk_size``."""
    check_int("chunk_size", chunk_size, minimum=1)
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value % chunk_size:
            raise ConfigError(f"{name}={value!r} must be a positive multiple of chunk_size={chunk_size}; change one of them")
    return chunk_size


def args_free_on_resume(data_class: Any) -> frozenset[str]:
    """The constructor arguments of a data module that ``fit --ckpt_path`` may change: the ``free_on_resume`` names
    of its class and of every base class. Every other recorded argument must equal the checkpoint's
    (:func:`lit_icl.cli.checkpoints.check_resume_settings`).

    Free are the options that change no number a resumed run trains on, validates on or records: where the data
    lives (``root``, a moved folder), how batches are made (``num_workers``), whether a stand-in may be built, how the
    fixed evaluation sets are cut into steps (``eval_batch_size``) and what only ``test`` reads (``test_prompts``,
    test manifolds): a fit never builds its test sets, and a test may choose other ones. Validation settings are
    not free: the best checkpoint and the early-stopping rule compare the rounds of the whole run, which a
    resumed run would measure on another set.
    """
    return frozenset(name for cls in getattr(data_class, "__mro__", ())
                     for name in vars(cls).get("free_on_resume", ()))


def world_and_rank(datamodule: LightningDataModule) -> tuple[int, int]:
    """``(world size, global rank)`` of the trainer a data module is attached to; ``(1, 0)`` outside one."""
    trainer = datamodule.trainer
    return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)


def training_epoch(datamodule: LightningDataModule) -> int:
    """The epoch the attached trainer's fit loop is in (the one it will pass to ``set_epoch``); 0 outside one."""
    trainer = datamodule.trainer
    return int(trainer.fit_loop.epoch_progress.current.processed) if trainer is not None else 0


class ChunkedDataModule(LightningDataModule):
    """A data module whose datasets are :class:`SeededChunks`: the checks of the arguments every such module
    takes, the training epoch's items (sharded over DDP ranks by an :class:`EpochSampler`) and the loaders that
    stack chunks into batches.

    Its ``hparams`` (a subclass's ``save_hyperparameters()``) hold ``batch_size``, ``eval_batch_size``,
    ``train_batches_per_epoch``, ``data_seed``, ``num_workers`` and, where an item is a chunk of several
    examples, ``chunk_size`` (an item is one example otherwise).
    """

    #: Arguments that ``fit --ckpt_path`` may change (:func:`args_free_on_resume`): workers only move where batches are
    #: made, and the evaluation batch only how the fixed validation/test sets are cut into steps.
    free_on_resume: ClassVar[tuple[str, ...]] = ("num_workers", "eval_batch_size")

    @property
    def chunk_size(self) -> int:
        """Examples per dataset item: ``chunk_size``, or 1 for a module whose items are single examples."""
        return int(self.hparams.get("chunk_size", 1))

    def check_loader_args(self, *set_sizes: str) -> None:
        """One :class:`ConfigError` for the first bad shared argument: the batch sizes and the named set sizes
        (``val_episodes``, ...) positive multiples of ``chunk_size`` (items are whole chunks), at least one
        step per epoch, an integer ``data_seed``, no negative ``num_workers``."""
        hp = self.hparams
        #: The set sizes named here, for :meth:`check_eval_shards`.
        self.set_size_names = set_sizes
        sizes = {name: hp[name] for name in ("batch_size", "eval_batch_size", *set_sizes)}
        if "chunk_size" in hp:
            check_chunk_sizes(hp.chunk_size, sizes)
        else:
            for name, value in sizes.items():
                check_int(name, value, minimum=1)
        check_int("train_batches_per_epoch", hp.train_batches_per_epoch, minimum=1)
        check_int("data_seed", hp.data_seed)
        check_int("num_workers", hp.num_workers, minimum=0, hint="0 generates the data in the training process")

    def check_batches_fit(self, unit: str, examples: Mapping[str, tuple[int, str]], *held: DataPiece) -> None:
        """Refuse sizes whose data would not fit in this machine's memory (:mod:`lit_icl.core.memory`), before a
        run writes anything: one batch of each split and the sets ``held`` in memory (a fixed training set).

        Args:
            unit: what an example is, plural (``"prompts"``).
            examples: ``{split: (bytes of one example, what it holds)}`` for ``"training"`` (``batch_size``
                examples a batch) and the evaluation splits (``eval_batch_size``), e.g.
                ``{"training": (13332, "101 tokens x 33 values")}``.
            held: other data held at once.
        """
        hp = self.hparams
        pieces = list(held)
        for split, (nbytes, holds) in examples.items():
            option = "batch_size" if split == "training" else "eval_batch_size"
            pieces.append(DataPiece(f"one {split} batch", hp[option] * nbytes, f"{option}={hp[option]} {unit} of {holds}"))
        check_data_fits(pieces)

    def train_items(self) -> tuple[int, EpochSampler]:
        """``(items per epoch over all ranks, this rank's sampler)``: ``train_batches_per_epoch`` steps of
        ``batch_size / chunk_size`` chunks on every rank, so ``k`` ranks see what one process sees at ``k`` times
        the batch.

        The sampler starts at the trainer's current epoch. Lightning creates the loader's iterator before it calls
        ``set_epoch``, and on a resumed run it keeps that iterator for the first epoch; DataLoader workers fetch
        their first items when the iterator is created, so a sampler still at epoch 0 would make a run resumed
        with ``num_workers > 0`` train its next epoch on epoch 0's data again.
        """
        hp = self.hparams
        world, rank = world_and_rank(self)
        items = hp.train_batches_per_epoch * (hp.batch_size // self.chunk_size) * world
        sampler = EpochSampler(items, world, rank)
        sampler.set_epoch(training_epoch(self))
        return items, sampler

    def loader(self, dataset: Dataset, batch_size: int, sampler: Sampler[int] | None = None) -> DataLoader:
        """:func:`chunk_loader` with this module's ``chunk_size`` and ``num_workers``, pinning its batches when the
        trainer is on a CUDA device."""
        return chunk_loader(dataset, batch_size, self.chunk_size, self.hparams.num_workers, sampler,
                            pin_memory=pins_memory(self))

    def train_loader(self, dataset: Callable[[int], Dataset]) -> DataLoader:
        """The training loader of ``dataset(items)``, a dataset of this epoch's :meth:`train_items` items; a
        :class:`ResumableLoader`, so a run resumes exactly from a checkpoint written inside an epoch."""
        items, sampler = self.train_items()
        return chunk_loader(dataset(items), self.hparams.batch_size, self.chunk_size, self.hparams.num_workers,
                            sampler, resumable=self, pin_memory=pins_memory(self))

    def eval_loader(self, dataset: Dataset) -> DataLoader:
        """A validation/test loader: ``dataset`` in order, ``eval_batch_size`` examples a batch."""
        return self.loader(dataset, self.hparams.eval_batch_size)

    def check_eval_shards(self, world_size: int, splits: tuple[str, ...]) -> None:
        """Refuse an evaluation set of ``splits`` (``"val"``, ``"test"``) whose items ``world_size`` DDP ranks
        cannot share evenly. Lightning shards evaluation loaders with a ``DistributedSampler`` that pads the last
        shard with items from the start, so those items would be scored twice and the synced means would differ
        from one process's, silently."""
        if world_size <= 1:
            return
        for name in getattr(self, "set_size_names", ()):
            if name.split("_", 1)[0] not in splits:
                continue  # a fixed training pool: its own sampler (train_items) shards it
            items = self.set_items(name)
            if items % world_size:
                chunk = self.chunk_size
                unit = f"{items} chunk{'s' * (items != 1)} of {chunk}" if chunk > 1 else f"{items} item{'s' * (items != 1)}"
                fit = -(-items // world_size) * world_size * chunk
                raise ConfigError(
                    f"--data.init_args.{name}={self.hparams[name]} is {unit}, which {world_size} ranks cannot share "
                    f"evenly (Lightning's DistributedSampler would score {world_size - items % world_size} of them "
                    f"twice); give a multiple of {world_size * chunk}, e.g. {fit}"
                )

    def set_items(self, size: str) -> int:
        """Items of a fixed evaluation set whose size in examples is the argument ``size`` (``val_episodes``)."""
        return self.hparams[size] // self.chunk_size


class StandinOnFirstUse(ABC):
    """Mixin for a data module whose data location defaults to an offline stand-in that it builds on first use.

    The subclass names the hyper-parameter that holds the location (:attr:`location_arg`) and the stand-in's
    location (:attr:`standin_location`), and writes :meth:`build_standin_into` and :meth:`standin_notice`; its
    ``build_standin`` hyper-parameter turns building off, so that a missing location is an error instead.
    ``prepare_data`` (once per node, before any setup) builds it.
    """

    #: The hyper-parameter naming the data's location (``root``, ``features``).
    location_arg: ClassVar[str]
    #: Where the stand-in lives, relative to the working folder.
    standin_location: ClassVar[str]
    #: Whether a missing stand-in may be built changes no number of a run (:func:`args_free_on_resume`); a subclass
    #: names its :attr:`location_arg` there too.
    free_on_resume: ClassVar[tuple[str, ...]] = ("build_standin",)

    def data_location(self) -> Path:
        return Path(self.hparams[self.location_arg])

    def builds_standin(self) -> bool:
        """Whether this run builds the stand-in: the location is the stand-in's (by any spelling of the path), it
        does not exist yet, and ``build_standin`` is on."""
        path = self.data_location()
        return (bool(self.hparams.build_standin) and not path.exists()
                and path.resolve() == Path(self.standin_location).resolve())

    def prepare_data(self) -> None:
        """Build the stand-in on first use, into a hidden sibling renamed when complete: an interrupted build
        leaves nothing behind that would look like data (the next run clears it and starts again).

        Runs that start at once in the same folder (a grid's ``--jobs 2``) build it once: each takes an exclusive
        lock on ``.<name>.lock`` beside it first, and a run that waited finds the stand-in built.
        """
        if not self.builds_standin():
            return
        path = self.data_location()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.parent / f".{path.name}.lock"
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
            if not self.builds_standin():
                return  # another run built it while this one waited
            partial = path.parent / f".{path.name}.partial"
            rank_zero_info(self.standin_notice())
            if partial.is_dir():
                shutil.rmtree(partial)
            partial.unlink(missing_ok=True)
            try:
                self.build_standin_into(partial)
                partial.rename(path)
            finally:
                # Every run re-checks for the stand-in once it holds a lock, so the file can go: a run that
                # opens a new one after this finds the stand-in built.
                lock_path.unlink(missing_ok=True)

    @abstractmethod
    def build_standin_into(self, path: Path) -> None:
        """Write the whole stand-in at ``path`` (a file or a folder)."""

    @abstractmethod
    def standin_notice(self) -> str:
        """The one line logged before building: what is built where, and about how long it takes."""
