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

from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from lit_icl.core.data import EpochSampler, world_and_rank
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.core.validation import check_int, check_literal, check_nonempty, check_positive
from lit_icl.i2cl.build import ensure_offline, offline_hint
from lit_icl.i2cl.tasks import (
    SYNTHETIC_LABELS,
    SYNTHETIC_TEMPLATE,
    TASKS,
    Example,
    Source,
    TaskData,
    balanced_sample,
    demo_sample,
    load_hub,
    read_table,
    synthetic_example,
)

#: How calibration batches are drawn (see the module docstring).
CalibrationBatches = Literal["epoch", "replacement"]


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


class I2CLDataModule(LightningDataModule):
    """One task and one seed of I2CL's protocol (see the module docstring).

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
        self.save_hyperparameters()
        self._validate(**self.hparams)
        spec = TASKS.get(task)
        self.template = template or (spec.template if spec else SYNTHETIC_TEMPLATE)
        words = label_words if label_words is not None else list(spec.label_words if spec else SYNTHETIC_LABELS)
        self.label_words = [str(w) for w in words]
        self.shots = int(shots_per_class if shots_per_class is not None else (spec.shots_per_class if spec else 5))
        self.task_name = task if task not in ("jsonl", "csv") else Path(test_file).parent.name or task
        self._data: TaskData | None = None

    @staticmethod
    def _validate(
        *,
        task: str,
        train_file: str | None,
        test_file: str | None,
        template: str | None,
        label_words: list[str] | None,
        shots_per_class: int | None,
        eval_samples: int,
        holdout_samples: int,
        data_seed: int,
        eval_seed: int,
        synthetic_train: int,
        synthetic_test: int,
        max_chars: int | None,
        batch_size: int,
        eval_batch_size: int,
        example_separator: str = "\n",
        calibration_batches: str = "epoch",
        **_: object,
    ) -> None:
        """The constructor's argument checks (``**_``: the options with nothing to check, and what the CLI adds
        to the hyper-parameters)."""
        check_literal("task", task, Source)
        spec = TASKS.get(task)
        if task in ("jsonl", "csv"):
            if not train_file or not test_file:
                raise ConfigError(f"task={task!r} needs train_file and test_file (local .{task} files of text, label)")
            if template is None or label_words is None:
                raise ConfigError(f"task={task!r} needs template (with {{text}}) and label_words in the config")
        template = template or (spec.template if spec else SYNTHETIC_TEMPLATE)
        if "{text}" not in template:
            raise ConfigError(f"template={template!r} must contain {{text}}, e.g. 'Review: {{text}}\\nSentiment:'")
        words = label_words if label_words is not None else list(spec.label_words if spec else SYNTHETIC_LABELS)
        words = [str(w) for w in check_nonempty("label_words", words, "[negative, positive]")]
        if len(words) < 2 or len(set(words)) != len(words):
            raise ConfigError(f"label_words={words} must name at least two distinct classes")
        if spec is not None and label_words is not None and len(label_words) != len(spec.label_words):
            raise ConfigError(f"task {task!r} has {len(spec.label_words)} classes; give {len(spec.label_words)} label_words")
        check_positive("shots_per_class", shots_per_class if shots_per_class is not None
                       else (spec.shots_per_class if spec else 5), integer=True)
        check_positive("eval_samples", eval_samples, integer=True)
        check_int("holdout_samples", holdout_samples, minimum=0)
        check_int("data_seed", data_seed)
        check_int("eval_seed", eval_seed)
        check_positive("synthetic_train", synthetic_train, integer=True)
        check_positive("synthetic_test", synthetic_test, integer=True)
        if max_chars is not None:
            check_positive("max_chars", max_chars, integer=True)
        check_positive("batch_size", batch_size, integer=True)
        check_positive("eval_batch_size", eval_batch_size, integer=True)
        if not isinstance(example_separator, str) or not example_separator:
            raise ConfigError(f"example_separator={example_separator!r} must be a non-empty string, e.g. '\\n'")
        check_literal("calibration_batches", calibration_batches, CalibrationBatches)
        for name, f in (("train_file", train_file), ("test_file", test_file)):
            # the offline sentiment tasks are written on first use, as `python -m lit_icl.i2cl.build` would
            if f is not None and not Path(f).is_file() and not ensure_offline(f):
                hint = offline_hint(f, "offline movie reviews: python -m lit_icl.i2cl.build")
                raise ConfigError(f"{name}={f!r} does not exist ({hint})")

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

    # -------------------------------------------------------------- loading and sampling
    def _pools(self) -> tuple[list[Example], list[Example]]:
        hp = self.hparams
        if hp.task == "synthetic":
            train = [synthetic_example(hp.eval_seed, "train", i) for i in range(hp.synthetic_train)]
            test = [synthetic_example(hp.eval_seed, "test", i) for i in range(hp.synthetic_test)]
        elif hp.task in ("jsonl", "csv"):
            train = read_table(hp.train_file, hp.text_field, hp.label_field, self.label_words)
            test = read_table(hp.test_file, hp.text_field, hp.label_field, self.label_words)
        else:
            train, test = load_hub(TASKS[hp.task], hp.path)
        if hp.max_chars is not None:
            train = [(t[: hp.max_chars], y) for t, y in train]
            test = [(t[: hp.max_chars], y) for t, y in test]
        return train, test

    def task_data(self) -> TaskData:
        """Load once and sample this seed's demonstrations, the holdout and the fixed evaluation set."""
        if self._data is not None:
            return self._data
        hp = self.hparams
        train, test = self._pools()
        C = self.n_classes
        demo_idx = demo_sample(train, self.shots, C, make_generator(hp.data_seed, "i2cl_demos"))
        used = set(demo_idx)
        g_hold = make_generator(hp.data_seed, "i2cl_holdout")
        hold_idx = balanced_sample(train, hp.holdout_samples, C, g_hold, exclude=used) if hp.holdout_samples else []
        used |= set(hold_idx)
        rest = [i for i in range(len(train)) if i not in used]
        if not rest:
            raise ConfigError("the train split has no example left for the task vector's extra query; use a larger pool")
        extra = train[rest[int(torch.randint(len(rest), (1,), generator=g_hold))]]
        eval_idx = balanced_sample(test, hp.eval_samples, C, make_generator(hp.eval_seed, "i2cl_eval"))
        self._data = TaskData(
            name=self.task_name,
            template=self.template,
            label_words=self.label_words,
            demos=[train[i] for i in demo_idx],
            eval=[test[i] for i in eval_idx],
            holdout=[train[i] for i in hold_idx],
            extra_query=extra,
            meta={"train_pool": len(train), "test_pool": len(test)},
            separator=hp.example_separator,
        )
        return self._data

    # -------------------------------------------------------------- loaders
    @staticmethod
    def _collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"text": [it["text"] for it in items], "label": torch.tensor([it["label"] for it in items])}

    def train_dataloader(self) -> DataLoader:
        data = self.task_data()
        world, rank = world_and_rank(self)
        n = len(data.demos)
        # Whole batches per epoch (the public code's floor(N / 2) steps of 2) and the same count on every rank.
        per_epoch = max(world * self.hparams.batch_size, n - n % (world * self.hparams.batch_size))
        if self.hparams.calibration_batches == "replacement":
            # one global batch of world * batch_size distinct demonstrations per step; rank r takes its share
            items: Dataset = DrawnItems(data.demos, self.hparams.data_seed, world * self.hparams.batch_size)
        else:
            items = _Cyclic(CalibrationItems(data.demos, self.hparams.data_seed), per_epoch)
        return DataLoader(items, batch_size=self.hparams.batch_size, sampler=EpochSampler(per_epoch, world, rank),
                          collate_fn=self._collate)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(EvalItems(self.task_data().eval), batch_size=self.hparams.eval_batch_size,
                          shuffle=False, collate_fn=self._collate)


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
