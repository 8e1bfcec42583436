"""I2CL's tasks as text (App. A, Table 9): where each lives and how it is prompted, the readers of hub, local and
synthetic sources, and the class-balanced draws of demonstrations and queries. A run's :class:`TaskSource` (where
its examples come from) and :class:`TaskFormat` (how they are prompted) check its options once;
:mod:`lit_icl.i2cl.data` turns them into the loaders of a run.
"""

from __future__ import annotations

import csv
import json
import string
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch

from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.core.validation import check_literal, check_nonempty, check_positive


@dataclass(frozen=True)
class TaskSpec:
    """Where a task lives on the hub and how it is prompted (App. A, Table 9)."""

    hub_id: str
    config: str | None
    test_split: str
    text_field: str
    label_field: str
    template: str
    label_words: tuple[str, ...]
    shots_per_class: int = 5
    keep_labels: tuple[int, ...] | None = None  # hate_speech18: only {0: neutral, 1: hate}


TASKS: dict[str, TaskSpec] = {
    "sst2": TaskSpec("glue", "sst2", "validation", "sentence", "label", "Review: {text}\nSentiment:",
                     ("negative", "positive")),
    "sst5": TaskSpec("SetFit/sst5", None, "test", "text", "label", "Sentence: {text}\nSentiment:",
                     ("terrible", "negative", "neutral", "positive", "great")),
    "mr": TaskSpec("rotten_tomatoes", None, "test", "text", "label", "Review: {text}\nSentiment:",
                   ("negative", "positive")),
    "subj": TaskSpec("SetFit/subj", None, "test", "text", "label", "Sentence: {text}\nLabel:",
                     ("objective", "subjective")),
    "trec": TaskSpec("trec", None, "test", "text", "coarse_label", "Question: {text}\nAnswer Type:",
                     ("Abbreviation", "Entity", "Description", "Person", "Location", "Number")),
    "agnews": TaskSpec("ag_news", None, "test", "text", "label", "News: {text}\nType:",
                       ("World", "Sports", "Business", "Technology")),
    "dbpedia": TaskSpec("fancyzhx/dbpedia_14", None, "test", "content", "label", "Input: {text}\nLabel:",
                        ("company", "school", "artist", "athlete", "politics", "transportation", "building",
                         "nature", "village", "animal", "plant", "album", "film", "book"), shots_per_class=1),
    # Only a train split exists: its first half gives train/holdout, its second half the test set.
    "hate_speech18": TaskSpec("hate_speech18", None, "train", "text", "label", "Text: {text}\nLabel:",
                              ("neutral", "hate"), keep_labels=(0, 1)),
    "emoc": TaskSpec("emo", None, "test", "text", "label", "Dialogue: {text}\nEmotion:",
                     ("others", "happy", "sad", "angry")),
}
SYNTHETIC_TEMPLATE = "Input: {text}\nLabel:"
SYNTHETIC_LABELS = ("A", "B", "C")
SPECIAL_CHARS = "!@#$%^&*()-_=+[]{};:'\",.<>/?\\|`~"
#: The sources read from local (text, label) files; they have no template or label words of their own.
FILE_SOURCES = ("jsonl", "csv")
SOURCES = (*TASKS, "synthetic", *FILE_SOURCES)
#: ``task``'s choices as a type (``--help`` lists them), built from :data:`TASKS` so they are written once.
Source = Literal[SOURCES]  # type: ignore[valid-type]

Example = tuple[str, int]


def check_template_fields(template: str) -> None:
    """``template`` fills in ``{text}`` only: another placeholder or a lone brace would fail at the first prompt."""
    try:
        extra = [name for _, name, _, _ in string.Formatter().parse(template) if name not in (None, "text")]
    except ValueError as err:
        raise ConfigError(f"template={template!r} is not a format string ({err}); write a literal brace as {{{{ or "
                          "}}") from None
    if extra:
        raise ConfigError(f"template={template!r} has the placeholder {{{extra[0]}}}, but only {{text}} is filled in; "
                          "remove it, or write a literal brace as {{ or }}")


@dataclass(frozen=True)
class TaskFormat:
    """How a run prompts its task: the ``template`` (with ``{text}``), one label word per class and the
    demonstrations per class (``shots``), each the paper's (App. A, :data:`TASKS`) unless the config gives it."""

    template: str
    label_words: list[str]
    shots: int

    @classmethod
    def resolve(cls, task: str, template: str | None, label_words: list[str] | None,
                shots_per_class: int | None) -> TaskFormat:
        """``task``'s format with the config's overrides (``None``: the task's own), checked: one one-line
        :class:`ConfigError` for the first bad value."""
        spec = TASKS.get(task)
        if task in FILE_SOURCES and (template is None or label_words is None):
            raise ConfigError(f"task={task!r} needs template (with {{text}}) and label_words in the config")
        template = template if template is not None else (spec.template if spec else SYNTHETIC_TEMPLATE)
        if "{text}" not in template:
            raise ConfigError(f"template={template!r} must contain {{text}}, e.g. 'Review: {{text}}\\nSentiment:'")
        check_template_fields(template)
        words = label_words if label_words is not None else list(spec.label_words if spec else SYNTHETIC_LABELS)
        words = [str(w) for w in check_nonempty("label_words", words, "[negative, positive]")]
        if len(words) < 2 or len(set(words)) != len(words):
            raise ConfigError(f"label_words={words} must name at least two distinct classes")
        if any(not w.strip() for w in words):
            raise ConfigError(f"label_words={words} has an empty word; give every class a word, e.g. [negative, positive]")
        classes = spec.label_words if spec else SYNTHETIC_LABELS if task == "synthetic" else words
        if len(words) != len(classes):
            raise ConfigError(f"task {task!r} has {len(classes)} classes; give {len(classes)} label_words")
        shots = shots_per_class if shots_per_class is not None else (spec.shots_per_class if spec else 5)
        return cls(template, words, check_positive("shots_per_class", shots, integer=True))


@dataclass(frozen=True)
class TaskSource:
    """Where a run's (text, label) examples come from, checked when built.

    Args:
        task: one of :data:`TASKS`, ``synthetic``, ``jsonl`` or ``csv``.
        path: local copy of a hub task for ``datasets.load_dataset`` (default: the hub id).
        train_file / test_file: the (text, label) files of ``jsonl`` / ``csv``.
        text_field / label_field: column names in ``jsonl`` / ``csv`` files.
        synthetic_train / synthetic_test: pool sizes of the synthetic task.
        max_chars: truncate texts to this many characters (None: keep them whole).
    """

    task: Source
    path: str | None = None
    train_file: str | None = None
    test_file: str | None = None
    text_field: str = "text"
    label_field: str = "label"
    synthetic_train: int = 300
    synthetic_test: int = 600
    max_chars: int | None = None

    def __post_init__(self) -> None:
        check_literal("task", self.task, Source)
        if self.task in FILE_SOURCES and not (self.train_file and self.test_file):
            raise ConfigError(f"task={self.task!r} needs train_file and test_file (local .{self.task} files of "
                              "text, label)")
        self._check_options_apply()
        check_positive("synthetic_train", self.synthetic_train, integer=True)
        check_positive("synthetic_test", self.synthetic_test, integer=True)
        if self.max_chars is not None:
            check_positive("max_chars", self.max_chars, integer=True)

    def _check_options_apply(self) -> None:
        """Refuse an option that this ``task`` never reads, given another value than its default: it was ignored
        without a word (a ``path`` with the synthetic task trained on the synthetic task). ``path`` is read by the hub
        tasks alone, ``train_file``, ``test_file``, ``text_field`` and ``label_field`` by ``jsonl`` / ``csv`` alone, and
        ``synthetic_train`` and ``synthetic_test`` by ``synthetic`` alone; the others apply to every task."""
        hub = f"the hub tasks ({', '.join(TASKS)})"
        readers = {"path": (tuple(TASKS), hub), "synthetic_train": (("synthetic",), "task synthetic"),
                   "synthetic_test": (("synthetic",), "task synthetic"),
                   **{name: (FILE_SOURCES, "task jsonl or csv")
                      for name in ("train_file", "test_file", "text_field", "label_field")}}
        defaults = {f.name: f.default for f in fields(self)}
        for name, (tasks, which) in readers.items():
            value = getattr(self, name)
            if self.task not in tasks and value != defaults[name]:
                raise ConfigError(f"{name}={value!r} applies only to {which}, and task={self.task!r} never reads it; "
                                  f"remove {name}, or choose such a task")

    @property
    def name(self) -> str:
        """The task's name in results: ``task``, or for local files the folder of ``test_file``."""
        return self.task if self.task not in FILE_SOURCES else Path(self.test_file).parent.name or self.task

    def ensure_files(self) -> None:
        """Refuse a missing ``train_file`` / ``test_file`` (a separate step, so that a caller can check every other
        option first and write nothing for a bad config)."""
        # Imported here, as in nets.CausalLM: no eager import of the `python -m` script.
        from lit_icl.i2cl.build import ensure_offline, offline_hint

        for name, f in (("train_file", self.train_file), ("test_file", self.test_file)):
            # the offline sentiment tasks are written on first use, as `python -m lit_icl.i2cl.build` would
            if f is not None and not Path(f).is_file() and not ensure_offline(f):
                hint = offline_hint(f, "offline movie reviews: python -m lit_icl.i2cl.build")
                raise ConfigError(f"{name}={f!r} does not exist ({hint})")

    def pools(self, label_words: list[str], synthetic_seed: int) -> tuple[list[Example], list[Example]]:
        """The (train, test) examples, texts cut to ``max_chars``.

        Args:
            label_words: the classes, in order (a file's label may be its label word).
            synthetic_seed: generates the synthetic task's examples.
        """
        if self.task == "synthetic":
            train = [synthetic_example(synthetic_seed, "train", i) for i in range(self.synthetic_train)]
            test = [synthetic_example(synthetic_seed, "test", i) for i in range(self.synthetic_test)]
        elif self.task in FILE_SOURCES:
            train = read_table(self.train_file, self.text_field, self.label_field, label_words)
            test = read_table(self.test_file, self.text_field, self.label_field, label_words)
        else:
            train, test = load_hub(TASKS[self.task], self.path)
        if self.max_chars is not None:
            train = [(t[: self.max_chars], y) for t, y in train]
            test = [(t[: self.max_chars], y) for t, y in test]
        return train, test


@dataclass
class TaskData:
    """Everything one (task, seed) run needs, as text."""

    name: str
    template: str
    label_words: list[str]
    demos: list[Example]
    eval: list[Example]
    holdout: list[Example]
    extra_query: Example
    meta: dict[str, Any] = field(default_factory=dict)
    separator: str = "\n"  #: what ends each demonstration (the public code's ``example_separator``)

    def query(self, text: str) -> str:
        return self.template.format(text=text)

    def demo(self, ex: Example) -> str:
        return f"{self.query(ex[0])} {self.label_words[ex[1]]}{self.separator}"

    @property
    def demo_texts(self) -> list[str]:
        return [self.demo(d) for d in self.demos]

    @property
    def prefix(self) -> str:
        """The few-shot prompt's demonstration part: the demonstrations in a row, each ending in the separator."""
        return "".join(self.demo_texts)


# ---------------------------------------------------------------------- synthetic task (App. C.2)
def synthetic_example(data_seed: int, split: str, index: int) -> Example:
    """Class ``index % 3``: random lowercase string / random special characters / random numbers."""
    g = make_generator(data_seed, "i2cl_synthetic", split, index)
    label = index % 3
    n = int(torch.randint(3, 7, (1,), generator=g))
    if label == 0:
        words = []
        for _ in range(n):
            k = int(torch.randint(3, 9, (1,), generator=g))
            words.append("".join(string.ascii_lowercase[int(i)] for i in torch.randint(0, 26, (k,), generator=g)))
        text = " ".join(words)
    elif label == 1:
        words = []
        for _ in range(n):
            k = int(torch.randint(2, 6, (1,), generator=g))
            words.append("".join(SPECIAL_CHARS[int(i)] for i in torch.randint(0, len(SPECIAL_CHARS), (k,), generator=g)))
        text = " ".join(words)
    else:
        text = " ".join(str(int(v)) for v in torch.randint(0, 10000, (n,), generator=g))
    return text, label


# ---------------------------------------------------------------------- readers
def read_table(path: str | Path, text_field: str, label_field: str, label_words: list[str]) -> list[Example]:
    """Rows of a local ``.jsonl`` / ``.csv``; labels are ints ``0..C-1`` or the label words themselves.

    A file that is not UTF-8, a ``.jsonl`` line that is not a JSON object, or a row without the text or label
    field is one :class:`ConfigError` naming the file and the line (1-based, as an editor shows it).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"data file {str(p)!r} does not exist; give a .jsonl or .csv of (text, label) rows")
    rows: list[tuple[int, Any]] = []  # (line number, row)
    try:
        with open(p, newline="" if p.suffix == ".csv" else None, encoding="utf-8") as f:
            if p.suffix == ".csv":
                reader = csv.DictReader(f)
                rows = [(reader.line_num, row) for row in reader]
            else:
                for number, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        rows.append((number, json.loads(line)))
                    except json.JSONDecodeError as err:
                        problem = err.msg.removesuffix(" at")  # "Invalid control character at" + " at column 3"
                        raise ConfigError(
                            f"{p}: line {number} is not valid JSON ({problem} at column {err.colno}); each line of "
                            f"a .jsonl holds one object such as {{\"{text_field}\": \"...\", \"{label_field}\": 0}}"
                        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p} is not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8") from None
    except csv.Error as err:
        raise ConfigError(f"{p}: unreadable CSV ({err}); give a .csv with a header row naming the columns") from None
    if not rows:
        raise ConfigError(f"{p} holds no rows; give a .{p.suffix.lstrip('.') or 'jsonl'} of (text, label) rows")
    out = []
    for number, row in rows:
        where = f"{p}: line {number}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where} holds a JSON {type(row).__name__}, not an object with {text_field!r} and "
                              f"{label_field!r}")
        missing = [k for k in (text_field, label_field) if row.get(k) is None]
        if missing:
            raise ConfigError(f"{where} lacks {' and '.join(map(repr, missing))} (its fields: {sorted(map(str, row))}); "
                              "set text_field/label_field or fix the row")
        out.append((str(row[text_field]), _label_id(row[label_field], label_words, where)))
    return out


def _label_id(value: Any, label_words: list[str], where: str) -> int:
    if isinstance(value, str) and value in label_words:
        return label_words.index(value)
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: label {value!r} is neither 0..{len(label_words) - 1} nor a label word") from None
    if not 0 <= k < len(label_words):
        raise ConfigError(f"{where}: label {k} outside 0..{len(label_words) - 1} (one label word per class)")
    return k


def load_hub(spec: TaskSpec, path: str | None) -> tuple[list[Example], list[Example]]:
    """(train, test) examples of a hub task (or a local copy at ``path``) through ``datasets``."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("the nine paper tasks need `datasets`; pip install 'lit_icl[i2cl]'") from None
    source = path or spec.hub_id
    try:
        ds = datasets.load_dataset(source, spec.config) if path is None else datasets.load_dataset(source)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; the user needs one line
        raise ConfigError(
            f"cannot load {source!r} with datasets ({type(err).__name__}); give a local copy with `path`"
        ) from None

    def rows(split: str) -> list[Example]:
        d = ds[split]
        out = [(str(t), int(y)) for t, y in zip(d[spec.text_field], d[spec.label_field])]
        if spec.keep_labels is not None:
            out = [ex for ex in out if ex[1] in spec.keep_labels]
        return out

    if spec.test_split == "train":  # hate_speech18: split the only split in two halves
        everything = rows("train")
        half = len(everything) // 2
        return everything[:half], everything[half:]
    return rows("train"), rows(spec.test_split)


# ---------------------------------------------------------------------- sampling
def balanced_sample(pool: list[Example], n: int, n_classes: int, g: torch.Generator, exclude: set[int] = frozenset()) -> list[int]:
    """Indices of ``n`` class-balanced examples (``n // C`` per class, the rest at random), in random order."""
    by_class: list[list[int]] = [[] for _ in range(n_classes)]
    for i, (_, y) in enumerate(pool):
        if i not in exclude:
            by_class[y].append(i)
    chosen: list[int] = []
    for idx in by_class:
        perm = torch.randperm(len(idx), generator=g).tolist()
        chosen += [idx[j] for j in perm[: n // n_classes]]
    rest = [i for i in range(len(pool)) if i not in exclude and i not in set(chosen)]
    need = min(n, len(pool) - len(exclude)) - len(chosen)
    if need > 0:
        perm = torch.randperm(len(rest), generator=g).tolist()
        chosen += [rest[j] for j in perm[:need]]
    order = torch.randperm(len(chosen), generator=g).tolist()
    return [chosen[j] for j in order]


def demo_sample(pool: list[Example], shots: int, n_classes: int, g: torch.Generator) -> list[int]:
    """``shots`` per class, shuffled; a class with too few examples is refused."""
    by_class: list[list[int]] = [[] for _ in range(n_classes)]
    for i, (_, y) in enumerate(pool):
        by_class[y].append(i)
    chosen = []
    for c, idx in enumerate(by_class):
        if len(idx) < shots:
            raise ConfigError(f"class {c} has {len(idx)} training examples, fewer than shots_per_class={shots}")
        perm = torch.randperm(len(idx), generator=g).tolist()
        chosen += [idx[j] for j in perm[:shots]]
    order = torch.randperm(len(chosen), generator=g).tolist()
    return [chosen[j] for j in order]
