"""I2CLDataModule: the synthetic task and the data protocol (balanced, disjoint demonstrations, holdout and
evaluation queries), hub tasks read from a local copy, calibration items as pure functions of seed and epoch."""


from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


from lit_icl.core.data import EpochSampler
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.i2cl.data import CalibrationItems, DrawnItems, I2CLDataModule
from lit_icl.i2cl.tasks import balanced_sample, synthetic_example


# ---------------------------------------------------------------------- data protocol
def test_synthetic_task_is_a_pure_function_of_seed_split_index() -> None:
    assert synthetic_example(0, "train", 7) == synthetic_example(0, "train", 7)
    assert synthetic_example(0, "train", 7) != synthetic_example(1, "train", 7)
    text, label = synthetic_example(3, "test", 5)
    assert label == 2 and all(w.isdigit() for w in text.split())
    text, label = synthetic_example(3, "test", 4)
    assert label == 1 and not any(ch.isalnum() for ch in text)
    text, label = synthetic_example(3, "test", 3)
    assert label == 0 and text.replace(" ", "").isalpha()


def test_protocol_samples_balanced_disjoint_sets(tmp_path: Path) -> None:
    rows = [{"text": f"item {i}", "label": ["neg", "pos", "mid"][i % 3]} for i in range(60)]
    rows += [{"text": f"extra {i}", "label": 0} for i in range(30)]  # class imbalance in the pool
    for name in ("train", "test"):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    dm = I2CLDataModule(task="jsonl", train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "test.jsonl"),
                        template="T: {text}\nL:", label_words=["neg", "pos", "mid"], eval_samples=30,
                        holdout_samples=9, shots_per_class=4, data_seed=3)
    data = dm.task_data()
    assert sorted(y for _, y in data.demos) == [0] * 4 + [1] * 4 + [2] * 4
    assert [sum(y == c for _, y in data.eval) for c in range(3)] == [10, 10, 10]
    assert [sum(y == c for _, y in data.holdout) for c in range(3)] == [3, 3, 3]
    assert not {t for t, _ in data.demos} & {t for t, _ in data.holdout}
    assert data.extra_query[0] not in {t for t, _ in data.demos + data.holdout}
    assert data.demo(data.demos[0]).endswith(f" {data.label_words[data.demos[0][1]]}\n")
    other = I2CLDataModule(task="jsonl", train_file=str(tmp_path / "train.jsonl"),
                           test_file=str(tmp_path / "test.jsonl"), template="T: {text}\nL:",
                           label_words=["neg", "pos", "mid"], eval_samples=30, shots_per_class=4, data_seed=4)
    assert other.task_data().eval == data.eval  # the evaluation set does not depend on the seed
    assert other.task_data().demos != data.demos
    g = make_generator(0)
    idx = balanced_sample([("x", i % 2) for i in range(7)], 5, 2, g)
    assert len(idx) == 5 and len(set(idx)) == 5


def test_hub_task_reads_a_local_copy_through_datasets(tmp_path: Path) -> None:
    """``path`` points ``datasets.load_dataset`` at a local folder; SST-2's test split is GLUE's validation."""
    pytest.importorskip("datasets")
    import csv

    for split, n in (("train", 40), ("validation", 20)):
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "label", "idx"])
            w.writerows([[f"{split} sentence {i}", i % 2, i] for i in range(n)])
    dm = I2CLDataModule(task="sst2", path=str(tmp_path), eval_samples=10, holdout_samples=4)
    data = dm.task_data()
    assert data.template == "Review: {text}\nSentiment:" and data.label_words == ["negative", "positive"]
    assert len(data.demos) == 10 and all(t.startswith("train") for t, _ in data.demos + data.holdout)
    assert len(data.eval) == 10 and all(t.startswith("validation") for t, _ in data.eval)
    assert [sum(y == c for _, y in data.eval) for c in range(2)] == [5, 5]


def test_calibration_items_reshuffle_every_epoch_as_a_pure_function() -> None:
    demos = [(f"t{i}", i % 2) for i in range(6)]
    items = CalibrationItems(demos, seed=0)
    epoch0 = [items[i]["text"] for i in range(6)]
    epoch1 = [items[6 + i]["text"] for i in range(6)]
    assert sorted(epoch0) == sorted(epoch1) == sorted(t for t, _ in demos)
    assert epoch0 != epoch1
    assert [items[6 + i]["text"] for i in range(6)] == epoch1


def _batches(dm: I2CLDataModule, epochs: int) -> list[list[str]]:
    loader = dm.train_dataloader()
    out = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        out.extend(batch["text"] for batch in loader)
    return out


def test_replacement_draws_every_step_afresh_as_the_public_code() -> None:
    """Each step's batch holds distinct demonstrations, steps per epoch stay floor(N / 2), a demonstration can come
    back within an epoch, and the draws are a pure function of (seed, step)."""
    dm = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=30, eval_samples=30,
                        calibration_batches="replacement")
    batches = _batches(dm, epochs=10)
    assert len(batches) == 10 * 3 and all(len(b) == 2 and b[0] != b[1] for b in batches)
    per_epoch = [[t for b in batches[3 * e: 3 * e + 3] for t in b] for e in range(10)]
    assert any(len(set(e)) < 6 for e in per_epoch)  # epochs are not permutations any more
    assert {t for e in per_epoch for t in e} == {t for t, _ in dm.task_data().demos}
    again = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=30, eval_samples=30,
                           calibration_batches="replacement")
    assert _batches(again, epochs=10) == batches
    epoch_dm = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=30, eval_samples=30,
                              calibration_batches="epoch")
    shuffled = _batches(epoch_dm, 3)
    assert all(len({t for b in shuffled[3 * e: 3 * e + 3] for t in b}) == 6 for e in range(3))


def test_replacement_draws_split_one_global_batch_over_ddp_ranks() -> None:
    """Two ranks at batch 2 see, step by step, the 4 distinct demonstrations one process draws at batch 4."""
    demos = [(f"t{i}", i % 2) for i in range(6)]
    items = DrawnItems(demos, seed=0, block=4)
    ranks = [[items[i]["text"] for i in EpochSampler(4, num_replicas=2, rank=r)] for r in (0, 1)]
    whole = [items[i]["text"] for i in range(4)]
    assert sorted(ranks[0] + ranks[1]) == sorted(whole) and len(set(whole)) == 4


def test_few_shot_prompt_separates_demonstrations_by_one_newline() -> None:
    dm = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=30, eval_samples=30)
    data = dm.task_data()
    (t0, y0), (t1, y1) = data.demos[:2]
    w = data.label_words
    assert data.prefix.startswith(f"Input: {t0}\nLabel: {w[y0]}\nInput: {t1}\nLabel: {w[y1]}\nInput: ")
    assert data.prefix.endswith("\n") and "\n\n" not in data.prefix
    assert data.demo_texts[0] == f"Input: {t0}\nLabel: {w[y0]}\n"  # vectorised alone, ending in the separator
    blank = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=30, eval_samples=30,
                           example_separator="\n\n").task_data()
    assert blank.prefix == "".join(f"Input: {t}\nLabel: {w[y]}\n\n" for t, y in data.demos)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("calibration_batches", "shuffle", "calibration_batches"),
    ("example_separator", "", "example_separator"),
])
def test_bad_batch_draws_and_separators_are_refused(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        I2CLDataModule(task="synthetic", **{key: value})
    assert "\n" not in str(info.value)


#: (the task's options, one it never reads): each was ignored without a word.
UNREAD = [
    ({"task": "synthetic"}, {"path": "data/sst2"}, "path='data/sst2' applies only to the hub tasks (sst2, "),
    ({"task": "synthetic"}, {"text_field": "sentence"}, "text_field='sentence' applies only to task jsonl or csv"),
    ({"task": "sst2"}, {"train_file": "x.jsonl"}, ("train_file='x.jsonl' applies only to task jsonl or csv, and "
     "task='sst2' never reads it; remove train_file, or choose such a task")),
    ({"task": "sst2"}, {"label_field": "y"}, "label_field='y' applies only to task jsonl or csv"),
    ({"task": "sst2"}, {"synthetic_train": 60}, "synthetic_train=60 applies only to task synthetic"),
    ({"task": "jsonl", "train_file": "a.jsonl", "test_file": "b.jsonl", "template": "{text}", "label_words": ["a", "b"]},
     {"path": "data/sst2"}, "and task='jsonl' never reads it"),
    ({"task": "csv", "train_file": "a.csv", "test_file": "b.csv", "template": "{text}", "label_words": ["a", "b"]},
     {"synthetic_test": 30}, "synthetic_test=30 applies only to task synthetic, and task='csv' never reads it"),
]


@pytest.mark.parametrize(("task", "unread", "needle"), UNREAD, ids=[next(iter(r[1])) + "-" + r[0]["task"] for r in UNREAD])
def test_an_option_the_task_never_reads_is_refused(task: dict, unread: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        I2CLDataModule(**task, **unread)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_options_at_their_defaults_pass_for_every_task() -> None:
    """A config need not know which task an overlay picks: the defaults of the other tasks' options are no error."""
    defaults = {"path": None, "train_file": None, "test_file": None, "text_field": "text", "label_field": "label",
                "synthetic_train": 300, "synthetic_test": 600}
    assert I2CLDataModule(task="synthetic", **defaults).source.synthetic_train == 300
    assert I2CLDataModule(task="sst2", **defaults).source.path is None


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_score_every_test_query_once(world: int) -> None:
    """Under DDP each rank's test loader holds its own queries: over the ranks, every query of the evaluation set
    exactly once (25 queries do not split evenly over 2 or 3 ranks, where Lightning's DistributedSampler would
    score some twice)."""
    from types import SimpleNamespace

    import torch

    dm = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=40,
                        eval_samples=25, eval_batch_size=4)
    alone = [t for b in dm.test_dataloader() for t in b["text"]]
    assert len(alone) == 25
    shards = []
    for rank in range(world):
        dm.trainer = SimpleNamespace(world_size=world, global_rank=rank,
                                     strategy=SimpleNamespace(root_device=torch.device("cpu")))
        shards.append([t for b in dm.test_dataloader() for t in b["text"]])
    assert sorted(t for shard in shards for t in shard) == sorted(alone)
    assert max(map(len, shards)) - min(map(len, shards)) == 1


def test_fewer_test_queries_than_ddp_ranks_are_refused_before_the_run() -> None:
    dm = I2CLDataModule(task="synthetic", shots_per_class=2, synthetic_train=60, synthetic_test=40, eval_samples=2)
    dm.check_eval_shards(2, ("test",))  # one query each
    dm.check_eval_shards(3, ("val",))  # a fit runs no test
    with pytest.raises(ConfigError, match=r"^--data.init_args.eval_samples=2 gives 2 test queries, fewer than the 3 "
                                          r"DDP ranks that share them; give at least 3$"):
        dm.check_eval_shards(3, ("test",))
