"""IC-SSL data module: purity of generated data, fresh epochs, fixed evaluation sets, input checks."""

from __future__ import annotations

import pytest
import torch

from lit_icl.core.data import EpochSampler, SeededChunks, collate_chunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.icssl.data import EpisodeChunks, ManifoldDataModule, balanced_accuracy, labeled_mask
from lit_icl.icssl.manifolds import PoseConfig
from lit_icl.icssl.sampling import get_manifold, sample_episodes


def _dm(**kw) -> ManifoldDataModule:
    args = {"n_points": 30, "batch_size": 16, "chunk_size": 8, "eval_batch_size": 16, "train_batches_per_epoch": 2,
            "val_episodes": 16, "test_episodes": 32}
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


def _chunk_as_before(manifolds, n_points, chunk, pose, labeled_range, *keys) -> dict[str, torch.Tensor]:
    """An item as EpisodeChunks generated it before it became a SeededChunks (commit 93c16ee), written out."""
    g = make_generator(0, *keys)
    which = torch.randint(len(manifolds), (chunk,), generator=g)
    xs, ys, order = [], [], []
    for k, manifold in enumerate(manifolds):
        idx = (which == k).nonzero().flatten()
        if idx.numel():
            ep = sample_episodes(manifold, idx.numel(), n_points, g, pose)
            xs.append(ep.x)
            ys.append(ep.y)
            order.append(idx)
    perm = torch.cat(order).argsort()
    item = {"x": torch.cat(xs)[perm], "y": torch.cat(ys)[perm]}
    if labeled_range is not None:
        item["n_labeled"] = torch.randint(labeled_range[0], labeled_range[1] + 1, (chunk,), generator=g)
    return item


def test_items_are_bit_identical_to_the_pre_seeded_chunks_code() -> None:
    """EpisodeChunks is a core.data.SeededChunks with the same seed keys: (split, i), or (split, stream, i)."""
    manifolds = [get_manifold("cylinder"), get_manifold("sphere")]
    train = EpisodeChunks("train", manifolds, 20, 8, 100, 0, PoseConfig(), (2, 10))
    test = EpisodeChunks("test", manifolds[:1], 20, 8, 4, 0, PoseConfig(), stream="cylinder")
    assert isinstance(train, SeededChunks) and train.stream == ("train",) and test.stream == ("test", "cylinder")
    for got, want in ((train[57], _chunk_as_before(manifolds, 20, 8, PoseConfig(), (2, 10), "train", 57)),
                      (test[3], _chunk_as_before(manifolds[:1], 20, 8, PoseConfig(), None, "test", "cylinder", 3))):
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize(
    ("specs", "rotation", "n_points", "chunk", "chunks"),
    [
        (["cylinder"], "planar", 100, 16, 4),  # the manifolds config: one manifold, whole chunks
        (["cylinder", "sphere"], "haar", 37, 5, 7),  # mixed chunks, odd sizes
        (["sphere", "cone", "spiral", "torus", "cylinder"], "none", 20, 3, 9),  # chunks missing some manifolds
        (["sphere*cylinder*cone*spiral*torus"], "planar", 50, 8, 4),  # a product, its labels by quantile
        (["sphere*torus", "cone*spiral"], "haar", 30, 4, 5),  # products, permuted factors
    ],
)
def test_chunks_made_together_are_the_chunks_made_alone(specs, rotation, n_points, chunk, chunks) -> None:
    """A DataLoader asks for a batch's chunks at once (``__getitems__``); EpisodeChunks makes them in one pass
    per manifold. Every chunk must still be, bit for bit, what its own generator makes alone."""
    manifolds = [get_manifold(s, permute_factors=True) if "*" in s else get_manifold(s) for s in specs]
    pose = PoseConfig(rotation=rotation)
    for split, labeled in (("train", (1, n_points - 1)), ("val", None)):
        ds = EpisodeChunks(split, manifolds, n_points, chunk, 1000, 0, pose, labeled)
        indices = [11 + 3 * j for j in range(chunks)]
        together = ds.__getitems__(indices)
        assert len(together) == chunks
        for i, got in zip(indices, together):
            want = _chunk_as_before(manifolds, n_points, chunk, pose, labeled, split, i)
            assert got.keys() == want.keys()
            for k in want:
                assert torch.equal(got[k], want[k]), (split, i, k)
    # And through the loader a run uses: each batch is its chunks, made alone, in index order.
    loader = _dm(train_manifolds=specs, n_points=n_points, chunk_size=chunk, batch_size=2 * chunk,
                 eval_batch_size=2 * chunk, val_episodes=2 * chunk, test_episodes=2 * chunk, pose_rotation=rotation,
                 product_permute_factors=True).train_dataloader()
    ds = loader.dataset
    batch = next(iter(loader))
    want = collate_chunks([ds.make_chunks([i])[0] for i in list(loader.sampler)[:2]])
    for k in want:
        assert torch.equal(batch[k], want[k]), k


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


# ---------------------------------------------------------------------------------------------------------
# Labeled subsets, balanced accuracy and the class-prior floor (issue: honest floors)
# ---------------------------------------------------------------------------------------------------------
def test_random_labeled_mask_is_the_first_m_points() -> None:
    y = torch.randint(0, 2, (5, 12), generator=torch.Generator().manual_seed(0))
    mask = labeled_mask(y, 4)
    assert torch.equal(mask, torch.arange(12).expand(5, 12) < 4)
    per_episode = labeled_mask(y, torch.tensor([1, 2, 3, 4, 5]))
    assert per_episode.sum(1).tolist() == [1, 2, 3, 4, 5]


def test_stratified_mask_labels_every_class_and_otherwise_the_first_points() -> None:
    g = torch.Generator().manual_seed(1)
    # Rare positives (about 10 %), as on the torus: random 3-point subsets often miss them.
    y = (torch.rand(400, 30, generator=g) < 0.1).long()
    y[:, 0] = 0  # every episode has a negative
    y[0] = 0  # one single-class episode
    for m in (2, 3, 7):
        mask = labeled_mask(y, m, "stratified")
        assert mask.sum(1).eq(m).all()
        for b in range(y.shape[0]):
            classes = y[b].unique().tolist()
            assert set(y[b][mask[b]].tolist()) == set(classes), "each present class is labeled"
            # Written independently: first occurrence of each class, then the earliest other points.
            firsts = [int((y[b] == c).nonzero()[0]) for c in classes]
            rest = [i for i in range(30) if i not in firsts]
            expected = set((firsts + rest)[:m])
            assert set(mask[b].nonzero().flatten().tolist()) == expected
    random_hits = (y * labeled_mask(y, 3)).sum(1).gt(0).float().mean()
    assert random_hits < 0.5, "the random 3-subset misses the positive class in most episodes here"


def test_balanced_accuracy_matches_per_class_recall_loop() -> None:
    g = torch.Generator().manual_seed(2)
    y = torch.randint(0, 3, (20, 15), generator=g)
    pred = torch.randint(0, 3, (20, 15), generator=g)
    mask = torch.rand(20, 15, generator=g) < 0.7
    got = balanced_accuracy(pred, y, mask, 3)
    for b in range(20):
        recalls = []
        for c in range(3):
            sel = mask[b] & (y[b] == c)
            if sel.any():
                recalls.append((pred[b][sel] == c).float().mean().item())
        assert got[b].item() == pytest.approx(sum(recalls) / len(recalls))
    # A constant predictor scores 1 / #present classes.
    two = torch.tensor([[0, 0, 0, 1]])
    assert balanced_accuracy(torch.zeros_like(two), two, torch.ones_like(two, dtype=torch.bool), 2).item() == 0.5


def test_class_prior_floor_is_the_best_constant_predictor() -> None:
    from lit_icl.icssl.module import ConstantPredictorStats

    g = torch.Generator().manual_seed(3)
    y = (torch.rand(64, 20, generator=g) < 0.3).long()
    mask = torch.ones_like(y, dtype=torch.bool)
    mask[:, :3] = False
    stats = ConstantPredictorStats(2)
    stats.update(y[:30], mask[:30])
    stats.update(y[30:], mask[30:])
    acc, bacc = stats.compute()
    # Independently: score each constant class per episode, average, keep the better constant.
    best = max(
        range(2),
        key=lambda c: sum(((y[b][mask[b]] == c).float().mean().item()) for b in range(64)),
    )
    exp_acc = sum((y[b][mask[b]] == best).float().mean().item() for b in range(64)) / 64
    exp_bacc = balanced_accuracy(torch.full_like(y, best), y, mask, 2).mean().item()
    assert best == 0
    assert acc.item() == pytest.approx(exp_acc, abs=1e-6) and bacc.item() == pytest.approx(exp_bacc, abs=1e-6)


def test_each_test_manifold_is_its_own_test_set_with_its_own_rows() -> None:
    """Several test manifolds give one test set each (Tables 2-4's ID row from one model) and per-manifold
    rows whose accuracy is the mean per-episode accuracy of the net on that manifold's episodes alone."""
    from lightning.pytorch import Trainer

    from lit_icl.icssl import ICSSLModule
    from lit_icl.icssl.data import labeled_count
    from lit_icl.icssl.nets import GDICLHead, InContextEigenmap, SemiSupervisedICL

    dm = _dm(test_manifolds=["cylinder", "sphere"], eval_label_ratios=[0.1, 0.3])
    dm.setup("test")
    loaders = dm.test_dataloader()
    assert dm.test_set_names == ["cylinder", "sphere"] and len(loaders) == 2
    # Each set holds only its manifold: the same episodes as a dataset of that manifold in that stream.
    for name, loader in zip(dm.test_set_names, loaders):
        alone = EpisodeChunks("test", [get_manifold(name)], 30, 8, 4, 0, dm.pose, stream=name)
        assert torch.equal(next(iter(loader))["x"][:8], alone[0]["x"])
    assert not torch.equal(next(iter(loaders[0]))["x"], next(iter(loaders[1]))["x"])
    assert _dm(test_manifolds=["cylinder", "sphere"], test_per_manifold=False).test_set_names is None
    assert _dm(test_manifolds=["cylinder"]).test_set_names is None

    torch.manual_seed(0)
    net = SemiSupervisedICL(InContextEigenmap(n_points=30, stack_repeats=1), GDICLHead())
    module = ICSSLModule(net=net, eig_reference=False)
    Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False).test(module, datamodule=dm)
    rows = [r for r in module.test_rows if r["metric"] == "accuracy" and r["method"] == module.method]
    assert {(r["manifold"], r["label_ratio"]) for r in rows} == {(m, q) for m in ("cylinder", "sphere")
                                                                   for q in (0.1, 0.3)}
    net.eval()
    for name, loader in zip(dm.test_set_names, loaders):
        for ratio in (0.1, 0.3):
            accs = []
            with torch.no_grad():
                for batch in loader:
                    x, y = batch["x"], batch["y"]
                    labeled = labeled_mask(y, labeled_count(ratio, 30))
                    pred = net(x, y, labeled).logits.argmax(-1)
                    accs += [((pred[b] == y[b])[~labeled[b]]).float().mean().item() for b in range(len(y))]
            got = next(r["value"] for r in rows if r["manifold"] == name and r["label_ratio"] == ratio)
            assert got == pytest.approx(sum(accs) / len(accs), abs=1e-6)
