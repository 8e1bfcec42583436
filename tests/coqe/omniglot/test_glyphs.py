"""The offline `glyphs` stand-in: class count, distinctness, Omniglot layout, drawer variation, determinism."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lit_icl.coqe.omniglot.data import index_folder, load_bank
from lit_icl.coqe.omniglot.glyphs import build_glyphs, draw, select_glyphs
from lit_icl.core.errors import ConfigError


def test_full_set_has_1623_distinct_glyph_classes() -> None:
    names, protos = select_glyphs(1623)
    assert len(names) == 1623 and protos.shape == (1623, 105, 105)
    assert len(set(names)) == 1623
    assert len({a for a, _ in names}) >= 30, "many alphabets"
    # Pairwise distinct even after blurring to 16x16 (the builder's duplicate test, recomputed here).
    small = F.adaptive_avg_pool2d(protos[:, None], 16).flatten(1)
    d = torch.cdist(small, small) + torch.eye(1623) * 1e9
    assert d.min() >= 0.5


def test_build_writes_omniglot_layout_and_bank(tmp_path) -> None:
    out = build_glyphs(tmp_path / "glyphs", n_classes=12, n_drawers=3, seed=0)
    index = index_folder(out)
    assert index.n_classes == 12 and index.n_exemplars == 3
    assert {n.split("/")[0] for n in index.class_names} == {"images_background", "images_evaluation"}
    first = index.files[0][0]
    assert first.name.endswith("_01.png") and first.name[:4].isdigit()
    cached = load_bank(out, 105)  # from the cache the build wrote
    (out / "lit_icl_bank_105.pt").unlink()
    reread = load_bank(out, 105)  # from the PNGs
    assert torch.equal(cached, reread), "the build's cache must equal what the reader makes of its PNGs"
    assert set(reread.unique().tolist()) == {0, 255}  # binary ink on paper, like Omniglot
    ink = (reread == 0).float().mean((-1, -2))
    assert bool((ink > 0.01).all()) and bool((ink < 0.5).all())
    # Drawers differ from each other; rebuilding with the same seed gives the same drawings.
    assert not torch.equal(reread[:, 0], reread[:, 1])
    again = load_bank(build_glyphs(tmp_path / "again", n_classes=12, n_drawers=3, seed=0), 105)
    assert torch.equal(again, reread)
    with pytest.raises(ConfigError, match="exists already"):
        build_glyphs(out, n_classes=12, n_drawers=3)


def test_two_builds_racing_for_one_folder_both_succeed(tmp_path, monkeypatch) -> None:
    """Two runs on a fresh machine may build the stand-in at once; the later rename keeps the first folder."""
    from lit_icl.coqe.omniglot import glyphs

    out = tmp_path / "glyphs"
    real = glyphs._build_into
    calls: list[Path] = []

    def build_then_lose_the_race(tmp, *args) -> None:
        calls.append(tmp)
        real(tmp, *args)
        if len(calls) == 1:  # another process (another pid) finishes the same build before this one renames
            with monkeypatch.context() as m:
                m.setattr(glyphs.os, "getpid", lambda: 424242)
                glyphs.build_glyphs(out, n_classes=6, n_drawers=2, seed=0)

    monkeypatch.setattr(glyphs, "_build_into", build_then_lose_the_race)
    assert glyphs.build_glyphs(out, n_classes=6, n_drawers=2, seed=0) == out
    assert len(calls) == 2 and calls[0] != calls[1], "each process builds into its own temporary folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glyphs"], "no temporary folder is left behind"
    assert (out / "lit_icl_bank_105.pt").is_file(), "the bank cache is in place when the folder appears"
    assert load_bank(out, 105).shape == (6, 2, 105, 105)


def test_failed_build_leaves_nothing(tmp_path, monkeypatch) -> None:
    from lit_icl.coqe.omniglot import glyphs

    def fail(*args) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(glyphs, "select_glyphs", fail)
    with pytest.raises(OSError, match="disk full"):
        glyphs.build_glyphs(tmp_path / "glyphs", n_classes=6, n_drawers=2)
    assert list(tmp_path.iterdir()) == []


def test_drawers_keep_the_glyph_recognisable() -> None:
    """Each drawing overlaps its own class's glyph more than other classes' glyphs (nearest-prototype check)."""
    _, protos = select_glyphs(40)
    drawings = draw(protos, 4, torch.Generator().manual_seed(0))
    ink = (drawings == 0).float()
    blur = lambda x: F.avg_pool2d(x.reshape(-1, 1, 105, 105), 9, 1, 4).flatten(1)
    p, q = blur(protos), blur(ink)
    p, q = F.normalize(p, dim=1), F.normalize(q, dim=1)
    nearest = (q @ p.T).argmax(1)
    acc = (nearest == torch.arange(40).repeat_interleave(4)).float().mean().item()
    assert acc > 0.5, acc  # chance is 1/40; pixel overlap under random affine maps is a crude classifier


@pytest.mark.parametrize("erode", [True, False])
def test_stroke_morphology_is_the_3x3_window_min_or_max_with_paper_outside(erode) -> None:
    """The stroke widths' erosion (min) and dilation (max), computed as a row pass then a column pass, equal the
    3x3 window's, taken here with ``max_pool2d`` over the image padded with 0 (outside is no ink), borders
    included, bit for bit."""
    from lit_icl.coqe.omniglot.glyphs import _morph

    y = torch.rand(5, 13, 11, generator=torch.Generator().manual_seed(0))
    sign = -1.0 if erode else 1.0  # min is -max(-x)
    window = sign * F.max_pool2d(sign * F.pad(y, (1, 1, 1, 1), value=0.0)[:, None], 3, stride=1)[:, 0]
    assert torch.equal(_morph(y, erode=erode), window)
    assert torch.equal(_morph(y[:0], erode=erode), y[:0])  # no drawing takes this width

