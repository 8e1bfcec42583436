"""CoQE Omniglot data: folder reader, bank cache, class split, sequence statistics, evaluators, gathering."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from coqe.omniglot.helpers import write_omniglot_fixture
from PIL import Image

from lit_icl.coqe.omniglot.data import (
    OmniglotSequenceDataModule,
    SequenceChunks,
    gather_images,
    index_folder,
    load_bank,
    make_class_split,
    resolve_source,
    sample_chunk,
    training_labels,
)
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator


# ------------------------------------------------------------------------------------------ reader
def test_reader_orders_classes_and_drawers_and_caches(tmp_path) -> None:
    root = write_omniglot_fixture(tmp_path / "omniglot-py")
    index = index_folder(root)
    assert index.n_classes == 24 and index.n_exemplars == 4
    assert index.class_names[0] == "images_background/Alphabet_00/character01"
    assert index.class_names[12] == "images_evaluation/Alphabet_00/character01"
    bank = load_bank(root, 16)
    assert bank.shape == (24, 4, 16, 16) and bank.dtype == torch.uint8
    assert torch.equal(bank[:, :, 0, 0], torch.arange(24)[:, None].expand(24, 4).to(torch.uint8))
    assert torch.equal(bank[:, :, 0, 1], torch.arange(4)[None, :].expand(24, 4).to(torch.uint8))
    cache = root / "lit_icl_bank_16.pt"
    assert cache.is_file()
    # The cache is what a second call returns; a changed folder invalidates it.
    saved = torch.load(cache, weights_only=True)
    saved["images"][0, 0, 5, 5] = 123
    torch.save(saved, cache)
    assert int(load_bank(root, 16)[0, 0, 5, 5]) == 123
    Image.fromarray(torch.zeros(16, 16, dtype=torch.uint8).numpy(), mode="L").save(
        root / "images_background/Alphabet_00/character01/0001_01.png"
    )
    assert int(load_bank(root, 16)[0, 0, 0, 0]) == 0 and int(load_bank(root, 16)[0, 0, 5, 5]) == 0
    # A truncated cache (a killed build) is rebuilt from the PNGs, not trusted and not fatal.
    cache.write_bytes(cache.read_bytes()[:100])
    assert torch.equal(load_bank(root, 16)[:, :, 0, 1], bank[:, :, 0, 1])
    assert torch.load(cache, weights_only=True)["images"].shape == (24, 4, 16, 16)


def test_reader_resizes_with_area_average(tmp_path) -> None:
    root = write_omniglot_fixture(tmp_path / "f", n_classes=4, n_drawers=2)
    small = load_bank(root, 8)
    full = load_bank(root, 16).float()
    assert small.shape == (4, 2, 8, 8)
    expected = torch.nn.functional.avg_pool2d(full.view(-1, 1, 16, 16), 2).view(4, 2, 8, 8)
    assert (small.float() - expected).abs().max() <= 1.0  # BOX filter = 2x2 mean, rounded


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "neither images_background"),
        (lambda p: _unequal(p), "different numbers of drawings"),
    ],
)
def test_reader_rejects_missing_or_malformed_folders(tmp_path, make, needle) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        index_folder(make(tmp_path))
    assert "\n" not in str(info.value) and "glyphs" in str(info.value) or needle == "different numbers of drawings"


def _unequal(p: Path) -> Path:
    root = write_omniglot_fixture(p / "bad", n_classes=4, n_drawers=3)
    next((root / "images_background").rglob("*.png")).unlink()
    return root


def test_auto_source_prefers_omniglot(tmp_path) -> None:
    assert resolve_source("auto", tmp_path, None) == ("glyphs", tmp_path / "glyphs")
    (tmp_path / "omniglot-py").mkdir()
    assert resolve_source("auto", tmp_path, None) == ("omniglot", tmp_path / "omniglot-py")
    assert resolve_source("glyphs", tmp_path, "elsewhere") == ("glyphs", Path("elsewhere"))
    # A folder of one's own is neither Omniglot nor the stand-in: the log line and the results say "folder".
    assert resolve_source("auto", tmp_path, "mine") == ("folder", Path("mine"))


# ------------------------------------------------------------------------------------------ classes
def test_class_split_partitions_and_zipf_weights() -> None:
    split = make_class_split(100, n_holdout=10, n_common=5, zipf_alpha=1.0)
    allc = torch.cat([split.train, split.holdout])
    assert sorted(allc.tolist()) == list(range(100))
    assert len(split.common) == 5 and len(split.rare) == 85
    n = 90
    # p(label i) ~ 1 / (N - i)^alpha: the last label has rank 1.
    expected = torch.tensor([1.0 / (n - i) for i in range(n)], dtype=torch.float64)
    torch.testing.assert_close(split.probs.double(), expected / expected.sum(), rtol=1e-6, atol=0)
    assert torch.equal(make_class_split(100, 10, 5, 1.0).train, split.train)  # fixed by class_seed
    uniform = make_class_split(100, 10, 5, 0.0)
    torch.testing.assert_close(uniform.probs, torch.full((90,), 1 / 90))


def test_augmented_split_keeps_characters_together() -> None:
    split = make_class_split(20, n_holdout=16, n_common=8, zipf_alpha=1.0, augment=True)
    held = split.holdout.view(-1, 8)
    assert torch.equal(held % 8, torch.arange(8).expand(2, 8))
    assert len(set((held // 8)[:, 0].tolist()) & set((split.train // 8).tolist())) == 0


# ------------------------------------------------------------------------------------------ sequences
def test_training_sequences_statistics() -> None:
    split = make_class_split(60, n_holdout=10, n_common=5, zipf_alpha=1.0)
    g = make_generator("test", 0)
    b, p = 20000, 0.9
    labels, bursty = training_labels(split, b, p, g)
    assert labels.shape == (b, 9) and labels.min() >= 0 and labels.max() < 50
    # Fraction of bursty sequences: binomial, 5 sigma.
    assert abs(bursty.float().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / b)
    q = labels[:, -1]
    ctx = labels[:, :-1]
    same = (ctx == q[:, None]).sum(1)
    assert bool((same[bursty] >= 3).all())
    # The distractor: some other class appears at least 3 times in every bursty context.
    counts = torch.stack([(ctx == ctx[:, j : j + 1]).sum(1) for j in range(8)], 1)
    other = torch.where(ctx != q[:, None], counts, torch.zeros_like(counts)).max(1).values
    assert bool((other[bursty] >= 3).all())
    # Query classes follow the Zipf law (both kinds of sequence draw the query from it).
    freq = torch.bincount(q, minlength=50).double() / b
    se = (split.probs.double() * (1 - split.probs.double()) / b).sqrt()
    assert bool(((freq - split.probs.double()).abs() <= 5 * se + 1e-4).all())
    # Non-bursty contexts are i.i.d.: the query repeats in the context at the Zipf collision rate.
    iid_rate = (ctx[~bursty] == q[~bursty, None]).float().mean().item()
    assert abs(iid_rate - (split.probs.double() ** 2).sum().item()) < 0.02


def test_holdout_classes_never_appear_in_training_sequences() -> None:
    split = make_class_split(40, n_holdout=10, n_common=5, zipf_alpha=0.0)
    g = make_generator("test", 1)
    chunk = sample_chunk(split, "train", 4000, 4, g, p_bursty=0.5)
    held = set(split.holdout.tolist())
    assert held.isdisjoint(chunk["classes"].flatten().tolist())
    assert torch.equal(split.train[chunk["labels"]], chunk["classes"])


def test_icl_evaluator_invariants() -> None:
    split = make_class_split(40, n_holdout=10, n_common=5, zipf_alpha=1.0)
    chunk = sample_chunk(split, "icl", 2000, 20, make_generator("test", 2))
    classes, labels = chunk["classes"], chunk["labels"]
    assert set(classes.flatten().tolist()) <= set(split.holdout.tolist())
    assert set(labels.flatten().tolist()) == {0, 1}
    for seq_c, seq_l in zip(classes[:200], labels[:200]):
        kinds = sorted(set(seq_c[:8].tolist()))
        assert len(kinds) == 2
        assert sorted((seq_c[:8] == kinds[0]).sum().item() for _ in [0]) == [4]
        mapping = {c: l for c, l in zip(seq_c.tolist(), seq_l.tolist())}
        assert len(mapping) == 2 and set(mapping.values()) == {0, 1}
        assert all(mapping[c] == l for c, l in zip(seq_c.tolist(), seq_l.tolist()))  # incl. the query
        assert seq_c[8].item() in kinds
    # Labels 0/1 are assigned at random: the query's label is 0 about half the time.
    assert abs(labels[:, -1].float().mean().item() - 0.5) < 0.05
    # Drawings of a class are distinct within a sequence (20 drawings, 5 used).
    for seq_c, seq_e in zip(classes[:200], chunk["exemplars"][:200]):
        for c in set(seq_c.tolist()):
            used = seq_e[seq_c == c]
            assert len(set(used.tolist())) == len(used)


def test_iwl_evaluator_invariants() -> None:
    split = make_class_split(40, n_holdout=10, n_common=5, zipf_alpha=1.0)
    chunk = sample_chunk(split, "iwl", 3000, 20, make_generator("test", 3))
    labels = chunk["labels"]
    assert not bool((labels[:, :8] == labels[:, 8:]).any()), "no context item shares the query's class"
    assert torch.equal(split.train[labels], chunk["classes"])  # the training mapping
    freq = torch.bincount(labels[:, -1], minlength=30).double() / 3000
    se = (split.probs.double() * (1 - split.probs.double()) / 3000).sqrt()
    assert bool(((freq - split.probs.double()).abs() <= 5 * se + 1e-3).all())


def test_chunks_are_pure_functions_of_seed_kind_index() -> None:
    split = make_class_split(40, 10, 5, 1.0)
    a = sample_chunk(split, "train", 16, 4, make_generator(0, "train", 7))
    b = sample_chunk(split, "train", 16, 4, make_generator(0, "train", 7))
    c = sample_chunk(split, "train", 16, 4, make_generator(0, "train", 8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["labels"], c["labels"])


def test_gather_images_applies_flip_and_rotation() -> None:
    bank = torch.randint(0, 256, (5, 3, 6, 6), dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    classes = torch.randint(5, (4, 9), generator=g)
    ex = torch.randint(3, (4, 9), generator=g)
    aug = torch.randint(8, (4, 9), generator=g)
    out = gather_images(bank, classes, ex, aug)
    for b in range(4):
        for s in range(9):
            img = bank[classes[b, s], ex[b, s]].float() / 255
            a = int(aug[b, s])
            if a >= 4:
                img = img.flip(-1)
            torch.testing.assert_close(out[b, s], torch.rot90(img, a % 4, dims=(0, 1)))


def test_datamodule_gathers_images_on_transfer(tmp_path) -> None:
    root = write_omniglot_fixture(tmp_path / "omniglot-py")
    dm = OmniglotSequenceDataModule(
        source="omniglot", folder=str(root), image_size=16, n_holdout=4, n_common=2, batch_size=8,
        chunk_size=4, val_sequences=8, test_sequences=8, eval_batch_size=8,
    )
    assert dm.n_labels == 20 and dm.source == "omniglot"
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"classes", "exemplars", "augment", "labels"} and batch["labels"].shape == (8, 9)
    batch = dm.on_after_batch_transfer(batch, 0)
    assert batch["images"].shape == (8, 9, 16, 16)
    # Pixel (0, 0) encodes the class id of the file, (0, 1) the drawer.
    torch.testing.assert_close(batch["images"][..., 0, 0] * 255, batch["classes"].float())
    torch.testing.assert_close(batch["images"][..., 0, 1] * 255, batch["exemplars"].float())
    icl, iwl = dm.val_dataloader()
    assert set(next(iter(icl))["labels"].flatten().tolist()) <= {0, 1}
    assert len(list(iwl)) == 1


def test_the_test_sequences_are_not_the_validation_sequences(tmp_path) -> None:
    """Both sets are drawn from one seed; they used to share their item seeds too, so the validation sequences were
    the first of the test ones, and a checkpoint chosen on validation was tested on the sequences it was chosen on.
    The validation (and training) sequences keep their seeds: their numbers do not change."""
    root = write_omniglot_fixture(tmp_path / "omniglot-py")
    dm = OmniglotSequenceDataModule(
        source="omniglot", folder=str(root), image_size=16, n_holdout=4, n_common=2, batch_size=8,
        chunk_size=4, val_sequences=8, test_sequences=8, eval_batch_size=8,
    )
    dm.setup("fit")
    for kind, val, test in zip(("icl", "iwl"), dm.val_dataloader(), dm.test_dataloader()):
        val_batch, test_batch = next(iter(val)), next(iter(test))
        assert not torch.equal(val_batch["classes"], test_batch["classes"]), kind
        # validation: the seeds of (data_seed, kind, index), as before
        before = SequenceChunks(dm.split, kind, 4, 2, dm._n_exemplars, dm.hparams.data_seed, dm.hparams.p_bursty)
        assert torch.equal(val_batch["classes"], torch.cat([before[i]["classes"] for i in range(2)]))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"p_bursty": 1.5}, "p_bursty=1.5"),
        ({"batch_size": 10}, "batch_size=10 must be a positive multiple of chunk_size=4"),
        ({"image_size": 4}, "image_size=4"),
        ({"n_holdout": 1}, "at least 2 holdout"),
        ({"n_common": 30}, "n_common=30"),
        ({"zipf_alpha": -1.0}, "zipf_alpha=-1.0"),
        ({"source": "mnist"}, "source='mnist'"),
        ({"source": "auto", "folder": "/no/such/folder"}, "/no/such/folder: no images_background/ or images_evaluation/"),
        ({"folder": "/no/such/folder"}, "omniglot-py"),
        # The fix names the configured root, not data/ (where a run with another root would not look).
        ({"folder": None, "root": "/no/such/root", "download": False},
         ("Omniglot not found at /no/such/root/omniglot-py; put torchvision's Omniglot folder (omniglot-py, with "
          "images_background/ and images_evaluation/) in data.init_args.root")),
        ({"source": "glyphs", "folder": "/no/such/glyphs", "build_glyphs": False}, "python -m lit_icl.coqe.omniglot.glyphs"),
        ({"train_batches_per_epoch": 0}, "train_batches_per_epoch=0"),
    ],
)
def test_datamodule_bad_input(tmp_path, kwargs, needle) -> None:
    root = write_omniglot_fixture(tmp_path / "omniglot-py", n_classes=12, n_drawers=2)
    args = {"source": "omniglot", "folder": str(root), "image_size": 16, "n_holdout": 4, "n_common": 2,
            "batch_size": 8, "chunk_size": 4, "val_sequences": 8, "test_sequences": 8, "eval_batch_size": 8}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")) as info:
        OmniglotSequenceDataModule(**args)
    assert "\n" not in str(info.value)


def test_a_read_only_folder_still_loads_and_writes_nothing(tmp_path, monkeypatch) -> None:
    """The bank cache cannot be written (a read-only mount): the images come from the PNGs, kept in memory.

    Tests run as root, where chmod does not stop writes, so opening a file for writing in the folder is made to
    fail as a read-only file system makes it fail."""
    import builtins

    from lit_icl.coqe.omniglot.images import load_bank

    root = write_omniglot_fixture(tmp_path / "omniglot-py")
    before = sorted(p.name for p in root.iterdir())
    real_open = builtins.open

    def read_only_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax") and str(file).startswith(str(root)):
            raise OSError(30, "Read-only file system", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", read_only_open)
    bank = load_bank(root, 16)
    monkeypatch.undo()
    assert bank.shape == (24, 4, 16, 16)
    assert sorted(p.name for p in root.iterdir()) == before, "nothing written into the data folder"
    assert torch.equal(bank, load_bank(root, 16))  # the same images once the folder is writable (and cached)
