"""Tasks for I2CL (App. A): demonstrations, calibration queries and the class-balanced evaluation set.

Sources (``task``):

- the nine tasks of App. A (``sst2``, ``sst5``, ``mr``, ``subj``, ``trec``, ``agnews``, ``dbpedia``,
  ``hate_speech18``, ``emoc``) through HuggingFace ``datasets``: the hub id of :data:`TASKS` or a local copy
  (``path``: a folder ``load_dataset`` understands, e.g. a ``save_to_disk``-free parquet/CSV/JSON folder);
- ``synthetic``: App. C.2's three-class task without semantic or format priors, random strings / random special
  characters / random numbers labelled ``A`` / ``B`` / ``C``, generated as a pure function of
  ``(data_seed, split, index)``;
- ``jsonl`` / ``csv``: any local ``train_file`` / ``test_file`` of (text, label) rows with a ``template`` and
  ``label_words`` given in the config; ``python -m lit_icl.i2cl.build`` writes the offline movie-review task
  (``data/i2cl/movie_reviews``) in this format.

Protocol (Sec. 3 and the public code): ``shots_per_class`` demonstrations per class (5; 1 for DBPedia) drawn
from the train split by ``data_seed`` and shuffled; the same demonstrations, formatted as queries, are the
calibration set (Eq. 5); ``eval_samples`` (500) class-balanced test queries drawn once by ``eval_seed`` (the same
for every seed and method); ``holdout_samples`` (32) class-balanced train queries disjoint from the demonstrations
(the task vector's layer selection, App. B.1) and one extra train query (the task vector's dummy query).
A demonstration reads ``template.format(text=x) + " " + label_word + example_separator`` (a single newline by
default, as App. A and the public code); the few-shot prompt is the demonstrations in a row, then the query, which
ends at the template's colon. Each demonstration is vectorised on its own, so its last token is the separator's.

Calibration batches (``calibration_batches``): ``epoch`` walks a fresh shuffle of the demonstrations each epoch;
``replacement`` draws every step's batch afresh (distinct examples within a batch), as the public code does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from lit_icl.core.data import (
    EpochSampler,
    ResumableLoader,
    check_eval_units,
    eval_shards_loader,
    world_and_rank,
)
from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.seeding import make_generator
from lit_icl.core.transfer import pins_memory
from lit_icl.core.validation import check_int, check_literal, check_positive
from lit_icl.i2cl.tasks import (
    Example,
    Source,
    TaskData,
    TaskFormat,
    TaskSource,
    balanced_sample,
    demo_sample,
)

#: How calibration batches are drawn (see the module docstring).
CalibrationBatches = Literal["epoch", "replacement"]


# ---------------------------------------------------------------------- sampling
def sample_task_data(
    train: list[Example],
    test: list[Example],
    fmt: TaskFormat,
    name: str,
    *,
    eval_samples: int,
    holdout_samples: int,
    data_seed: int,
    eval_seed: int,
    separator: str = "\n",
) -> TaskData:
    """One seed's task (see the module docstring): its demonstrations, holdout and extra query from ``train``, and
    the evaluation set from ``test``.

    Args:
        train / test: the task's pools.
        fmt: the template, label words and demonstrations per class.
        name: the task's name in results.
        eval_samples / holdout_samples: class-balanced test queries / task-vector holdout queries.
        data_seed: draws the demonstrations, the holdout and the extra query.
        eval_seed: draws the evaluation set (fixed across seeds and methods).
        separator: what ends each demonstration.
    """
    C = len(fmt.label_words)
    demo_idx = demo_sample(train, fmt.shots, C, make_generator(data_seed, "i2cl_demos"))
    used = set(demo_idx)
    g_hold = make_generator(data_seed, "i2cl_holdout")
    hold_idx = balanced_sample(train, holdout_samples, C, g_hold, exclude=used) if holdout_samples else []
    used |= set(hold_idx)
    rest = [i for i in range(len(train)) if i not in used]
    if not rest:
        raise ConfigError("the train split has no example left for the task vector's extra query; use a larger pool")
    extra = train[rest[int(torch.randint(len(rest), (1,), generator=g_hold))]]
    if eval_samples > len(test):
        raise ConfigError(f"eval_samples={eval_samples} exceeds the {len(test)} examples of {name}'s test split; use at "
                          f"most {len(test)}")
    eval_idx = balanced_sample(test, eval_samples, C, make_generator(eval_seed, "i2cl_eval"))
    return TaskData(
        name=name,
        template=fmt.template,
        label_words=fmt.label_words,
        demos=[train[i] for i in demo_idx],
        eval=[test[i] for i in eval_idx],
        holdout=[train[i] for i in hold_idx],
        extra_query=extra,
        meta={"train_pool": len(train), "test_pool": len(test)},
        separator=separator,
    )


# ---------------------------------------------------------------------- datasets and loaders
class CalibrationItems(Dataset):
    """Item ``epoch * N + i`` is demonstration ``perm_epoch[i]`` as a query: a fresh shuffle every epoch."""

    def __init__(self, demos: list[Example], seed: int):
        self.demos, self.seed = demos, seed

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self.demos)
        epoch, i = divmod(index, n)
        perm = torch.randperm(n, generator=make_generator(self.seed, "i2cl_calibration", epoch))
        text, label = self.demos[int(perm[i])]
        return {"text": text, "label": label}


class _Cyclic(Dataset):
    """Global index ``epoch * per_epoch + i`` -> calibration item ``epoch * N + i`` (``i < per_epoch <= N``)."""

    def __init__(self, inner: CalibrationItems, per_epoch: int):
        self.inner, self.per_epoch = inner, per_epoch

    def __len__(self) -> int:
        return self.per_epoch

    def __getitem__(self, index: int) -> dict[str, Any]:
        epoch, i = divmod(index, self.per_epoch)
        n = len(self.inner)
        return self.inner[epoch * n + (i % n)]


class DrawnItems(Dataset):
    """Item ``step * block + j`` is the ``j``-th of ``block`` distinct demonstrations drawn for global step ``step``.

    Every step draws afresh (the public code's ``shuffle; take the first batch`` at each step), so a demonstration
    can repeat across steps within an epoch; the draw is a pure function of ``(seed, step)``, which keeps resumed
    runs exact. ``block`` is the global batch (all DDP ranks); blocks larger than the demonstrations wrap.
    """

    def __init__(self, demos: list[Example], seed: int, block: int):
        self.demos, self.seed, self.block = demos, seed, block

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, index: int) -> dict[str, Any]:
        step, j = divmod(index, self.block)
        perm = torch.randperm(len(self.demos), generator=make_generator(self.seed, "i2cl_calibration_draw", step))
        text, label = self.demos[int(perm[j % len(self.demos)])]
        return {"text": text, "label": label}


class EvalItems(Dataset):
    def __init__(self, items: list[Example]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        text, label = self.items[index]
        return {"text": text, "label": label}


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch: the texts as a list, the labels as a tensor."""
    return {"text": [it["text"] for it in items], "label": torch.tensor([it["label"] for it in items])}


def calibration_loader(demos: list[Example], seed: int, batch_size: int, how: CalibrationBatches = "epoch",
                       world: int = 1, rank: int = 0, pin_memory: bool = False,
                       resumable: LightningDataModule | None = None) -> DataLoader:
    """Rank ``rank``'s calibration batches of ``batch_size`` demonstrations, drawn ``how`` (see the module
    docstring) from ``seed``, over ``world`` DDP ranks; ``pin_memory`` for a CUDA run
    (:mod:`lit_icl.core.transfer`). With ``resumable`` (the data module of a fit) it is a
    :class:`~lit_icl.core.data.ResumableLoader`, which a run resumes inside an epoch."""
    n, block = len(demos), world * batch_size
    # Whole batches per epoch (the public code's floor(N / 2) steps of 2) and the same count on every rank.
    per_epoch = max(block, n - n % block)
    if how == "replacement":
        # one global batch of world * batch_size distinct demonstrations per step; rank r takes its share
        items: Dataset = DrawnItems(demos, seed, block)
    else:
        items = _Cyclic(CalibrationItems(demos, seed), per_epoch)
    extra: dict[str, Any] = {} if resumable is None else {"datamodule": resumable}
    return (DataLoader if resumable is None else ResumableLoader)(
        items, batch_size=batch_size, sampler=EpochSampler(per_epoch, world, rank), collate_fn=collate,
        pin_memory=pin_memory, **extra)


def check_draws_and_batches(hp: Mapping[str, Any], fmt: TaskFormat) -> None:
    """The checks of the data module's options (``hp``, its hyper-parameters) that neither the source nor the format
    checks; a calibration batch is at most the ``fmt.shots`` demonstrations per class of all classes."""
    for name in ("eval_samples", "batch_size", "eval_batch_size"):
        check_positive(name, hp[name], integer=True)
    demos = fmt.shots * len(fmt.label_words)
    if hp["batch_size"] > demos:
        raise ConfigError(f"batch_size={hp['batch_size']} exceeds the {demos} demonstrations a calibration batch is drawn "
                          f"from (shots_per_class={fmt.shots} x {len(fmt.label_words)} classes); use at most {demos}")
    check_int("holdout_samples", hp["holdout_samples"], minimum=0)
    check_int("data_seed", hp["data_seed"])
    check_int("eval_seed", hp["eval_seed"])
    if not isinstance(hp["example_separator"], str) or not hp["example_separator"]:
        raise ConfigError(f"example_separator={hp['example_separator']!r} must be a non-empty string, e.g. '\\n'")
    check_literal("calibration_batches", hp["calibration_batches"], CalibrationBatches)


def check_test_queries(datamodule: I2CLDataModule, world_size: int, splits: tuple[str, ...]) -> None:
    """Refuse fewer test queries than ``world_size`` DDP ranks before a ``test`` starts (the data module's
    ``check_eval_shards``): each rank scores queries of its own (:class:`~lit_icl.core.data.EvalShards`), and
    Lightning's sampler would have scored some twice."""
    if "test" in splits:
        n = datamodule.hparams.eval_samples
        check_eval_units(world_size, n, f"--data.init_args.eval_samples={n} gives {n} test queries",
                         f"give at least {world_size}")


# ---------------------------------------------------------------------- the data module
class I2CLDataModule(LightningDataModule):
    """One task and one seed of I2CL's protocol (see the module docstring).

    The options are checked once, when it is built: where the examples come from by its ``source``
    (:class:`~lit_icl.i2cl.tasks.TaskSource`), how they are prompted by its ``format``
    (:class:`~lit_icl.i2cl.tasks.TaskFormat`), the draws and batches here; :func:`sample_task_data` draws the run's
    examples and :func:`calibration_loader` batches its demonstrations.

    Args:
        task: one of :data:`TASKS`, ``synthetic``, ``jsonl`` or ``csv``.
        path: local copy of a hub task for ``datasets.load_dataset`` (default: the hub id).
        train_file / test_file: the (text, label) files of ``jsonl`` / ``csv``.
        template / label_words: prompt and verbalisers (required for ``jsonl`` / ``csv``; override the paper's).
        text_field / label_field: column names in ``jsonl`` / ``csv`` files.
        shots_per_class: demonstrations per class (default: 5, DBPedia 1).
        eval_samples / holdout_samples: class-balanced test queries / task-vector holdout queries.
        data_seed: draws the demonstrations (the paper's 5 runs are seeds 0..4).
        eval_seed: draws the evaluation set (fixed across seeds and methods).
        synthetic_train / synthetic_test: pool sizes of the synthetic task.
        max_chars: truncate texts to this many characters (None: keep them whole).
        batch_size: calibration batch (the public code's 2); eval_batch_size: test batch.
        example_separator: what ends each demonstration, in the few-shot prompt and in the vectorised
            demonstrations (``"\n"``: App. A and the public code; releases before 2026-11-26 used a blank line in
            the few-shot prompt only).
        calibration_batches: ``epoch`` (a shuffle per epoch) or ``replacement`` (a fresh draw every step, the
            public code).
    """

    #: What a resumed fit may change (``lit_icl.core.data.args_free_on_resume``): where a hub task's local copy
    #: or a file task's training file is (a moved or respelled path, as a moved ``root`` elsewhere), and what only
    #: ``test`` reads (its file, queries and batch). Not ``eval_seed``: the synthetic task's pools are drawn from it.
    free_on_resume = ("path", "train_file", "test_file", "eval_samples", "eval_batch_size")

    def __init__(
        self,
        task: Source = "sst2",
        path: str | None = None,
        train_file: str | None = None,
        test_file: str | None = None,
        template: str | None = None,
        label_words: list[str] | None = None,
        text_field: str = "text",
        label_field: str = "label",
        shots_per_class: int | None = None,
        eval_samples: int = 500,
        holdout_samples: int = 32,
        data_seed: int = 0,
        eval_seed: int = 42,
        synthetic_train: int = 300,
        synthetic_test: int = 600,
        max_chars: int | None = None,
        batch_size: int = 2,
        eval_batch_size: int = 8,
        example_separator: str = "\n",
        calibration_batches: CalibrationBatches = "epoch",
    ):
        super().__init__()
        save_init_hparams(self)
        self.source = TaskSource(task=task, path=path, train_file=train_file, test_file=test_file,
                                 text_field=text_field, label_field=label_field, synthetic_train=synthetic_train,
                                 synthetic_test=synthetic_test, max_chars=max_chars)
        self.format = TaskFormat.resolve(task, template, label_words, shots_per_class)
        check_draws_and_batches(self.hparams, self.format)
        # last: a missing offline task is written on first use, so only once every other option is valid
        self.source.ensure_files()
        self._data: TaskData | None = None

    @property
    def template(self) -> str:
        return self.format.template

    @property
    def label_words(self) -> list[str]:
        return self.format.label_words

    @property
    def shots(self) -> int:
        """Demonstrations per class."""
        return self.format.shots

    @property
    def task_name(self) -> str:
        return self.source.name

    @property
    def data_seed(self) -> int:
        """The seed of this run's demonstrations (``I2CLModule`` tags its rows and seeds its noise with it)."""
        return int(self.hparams.data_seed)

    @property
    def calibration_batches(self) -> str:
        """``epoch`` or ``replacement`` (``I2CLModule``'s plain calibration loop draws its batches the same way)."""
        return str(self.hparams.calibration_batches)

    @property
    def n_classes(self) -> int:
        return len(self.label_words)

    def task_data(self) -> TaskData:
        """Load once and sample this seed's demonstrations, the holdout and the fixed evaluation set."""
        if self._data is None:
            hp = self.hparams
            # the synthetic pools come from eval_seed, so every data_seed draws from the same examples
            train, test = self.source.pools(self.label_words, synthetic_seed=hp.eval_seed)
            self._data = sample_task_data(train, test, self.format, self.task_name, eval_samples=hp.eval_samples,
                                          holdout_samples=hp.holdout_samples, data_seed=hp.data_seed,
                                          eval_seed=hp.eval_seed, separator=hp.example_separator)
        return self._data

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        return calibration_loader(self.task_data().demos, hp.data_seed, hp.batch_size, hp.calibration_batches,
                                  *world_and_rank(self), pin_memory=pins_memory(self), resumable=self)

    def test_dataloader(self) -> DataLoader:
        return eval_shards_loader(self, EvalItems(self.task_data().eval), self.hparams.eval_batch_size,
                                  "test queries", collate_fn=collate)

    def check_eval_shards(self, world_size: int, splits: tuple[str, ...]) -> None:
        check_test_queries(self, world_size, splits)
