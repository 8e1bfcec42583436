"""IC-SSL data module: purity of generated data, fresh epochs, fixed evaluation sets, input checks."""

from __future__ import annotations

import pytest
import torch

from lit_icl.core.errors import ConfigError
from lit_icl.core.data import EpochSampler, collate_chunks
from lit_icl.icssl.data import EpisodeChunks, ManifoldDataModule
from lit_icl.icssl.manifolds import PoseConfig, get_manifold


def _dm(**kw) -> ManifoldDataModule:
    args = dict(n_points=30, batch_size=16, chunk_size=8, eval_batch_size=16, train_batches_per_epoch=2,
                val_episodes=16, test_episodes=32)
    args.update(kw)
    return ManifoldDataModule(**args)


def test_items_are_pure_functions_of_seed_split_and_index() -> None:
    ds = EpisodeChunks("train", [get_manifold("cylinder"), get_manifold("sphere")], 30, 8, 10, 0, PoseConfig(),
                       (2, 10))
    a, b = ds[3], ds[3]
    for k in a:
        assert torch.equal(a[k], b[k])
    assert not torch.equal(ds[3]["x"], ds[4]["x"])
    other_seed = EpisodeChunks("train", ds.manifolds, 30, 8, 10, 1, PoseConfig(), (2, 10))
    assert not torch.equal(other_seed[3]["x"], a["x"])
    assert a["x"].shape == (8, 30, 3) and a["y"].shape == (8, 30)
    assert a["n_labeled"].min() >= 2 and a["n_labeled"].max() <= 10


def test_training_data_is_fresh_each_epoch_and_eval_data_fixed() -> None:
    dm = _dm()
    loader = dm.train_dataloader()
    sampler = loader.sampler
    assert isinstance(sampler, EpochSampler)
    first = [b["x"] for b in loader]
    sampler.set_epoch(1)
    second = [b["x"] for b in loader]
    sampler.set_epoch(0)
    again = [b["x"] for b in loader]
    assert len(first) == 2 and first[0].shape == (16, 30, 3)
    assert not torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    # Validation and test sets do not depend on anything but data_seed.
    v1 = [b["x"] for b in dm.val_dataloader()]
    v2 = [b["x"] for b in _dm().val_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(v1, v2))
    assert not torch.equal(v1[0], next(iter(dm.test_dataloader()))["x"])


def test_ddp_shards_equal_one_process_with_the_total_batch() -> None:
    """Interleaved item sharding: 2 ranks x 8 episodes per step == 1 process x 16 (same episodes)."""
    single = _dm(batch_size=16)
    per_rank = _dm(batch_size=8)
    ds = single.train_dataloader().dataset
    items = list(EpochSampler(len(ds)))
    rank0, rank1 = EpochSampler(len(ds), 2, 0), EpochSampler(len(ds), 2, 1)
    for s in (rank0, rank1):
        s.set_epoch(3)
    assert sorted([*rank0, *rank1]) == list(range(3 * len(ds), 4 * len(ds)))  # disjoint, complete
    rank0.set_epoch(0)
    rank1.set_epoch(0)
    step0_single = collate_chunks([ds[i] for i in items[:2]])
    step0_ranks = collate_chunks([ds[next(iter(rank0))], ds[next(iter(rank1))]])
    assert torch.equal(step0_single["x"], step0_ranks["x"])
    assert per_rank.train_dataloader().batch_size == 1


def test_mixed_manifolds_keep_episode_order_random() -> None:
    dm = _dm(train_manifolds=["sphere", "cylinder", "cone", "torus"])
    batch = next(iter(dm.train_dataloader()))
    # z of the flat torus embedding is constant per episode before the pose; other manifolds vary in 3-D.
    assert batch["x"].shape == (16, 30, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eval_label_ratios": [0.25, 1.5]}, "outside (0, 1)"),
        ({"eval_label_ratios": [0.01]}, "leaves no labeled point"),
        ({"train_label_ratio": (0.0, 0.3)}, "outside (0, 1)"),
        ({"train_manifolds": ["cylindr"]}, "unknown manifold 'cylindr'"),
        ({"test_manifolds": ["sphere*torus"]}, "different ambient dimensions"),
        ({"batch_size": 12}, "multiple of chunk_size"),
        ({"pose_scale": (0.0, 0.1)}, "scale"),
    ],
)
def test_bad_data_configuration_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        _dm(**kwargs)
    assert "\n" not in str(info.value)
