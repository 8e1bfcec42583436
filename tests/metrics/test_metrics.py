"""Tests for lit_icl.metrics (functional + torchmetrics classes) and the RepresentationMetrics callback.

Reference values come from independent plain-Python computations (double loops over pairs, sorted()
neighbour lists, the textbook LCS table), never from the code under test.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_icl.metrics import (
    LCSKNN,
    CycleKNN,
    MutualKNN,
    SeparationScore,
    cycle_knn,
    knn_indices,
    lcs_knn,
    longest_common_subsequence,
    mutual_knn,
    separation_score,
)

# ---------------------------------------------------------------------------------------- plain-Python refs


def _cos(u: list[float], v: list[float]) -> float:
    dot = sum(a * b for a, b in zip(u, v))
    return dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))


def _bf_separation(emb: list[list[float]], labels: list[int]) -> float:
    """IC-SSL App. F.5 Remark 5 by brute force: class-averaged intra mean minus pair-weighted inter mean."""
    classes = sorted(set(labels))
    intra_means = []
    for c in classes:
        members = [i for i, y in enumerate(labels) if y == c]
        sims = [_cos(emb[i], emb[j]) for i in members for j in members if i != j]
        if sims:
            intra_means.append(sum(sims) / len(sims))
    n = len(emb)
    inter = [_cos(emb[i], emb[j]) for i in range(n) for j in range(n) if labels[i] != labels[j]]
    return sum(intra_means) / len(intra_means) - sum(inter) / len(inter)


def _bf_knn(feats: list[list[float]], k: int) -> list[list[int]]:
    out = []
    for i, u in enumerate(feats):
        sims = sorted(((_cos(u, v), j) for j, v in enumerate(feats) if j != i), reverse=True)
        out.append([j for _, j in sims[:k]])
    return out


def _bf_lcs(x: list[int], y: list[int]) -> int:
    dp = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i in range(1, len(x) + 1):
        for j in range(1, len(y) + 1):
            if x[i - 1] == y[j - 1]:
                dp[i][j] = dp[i - 1][j - 1] + 1
            else:
                dp[i][j] = max(dp[i - 1][j], dp[i][j - 1])
    return dp[-1][-1]


def _bf_alignment(a: torch.Tensor, b: torch.Tensor, k: int) -> dict[str, float]:
    na, nb = _bf_knn(a.tolist(), k), _bf_knn(b.tolist(), k)
    n = len(na)
    mnn = sum(len(set(na[i]) & set(nb[i])) / k for i in range(n)) / n
    cyc = sum(any(i in na[j] for j in nb[i]) for i in range(n)) / n
    lcs = sum(_bf_lcs(na[i], nb[i]) / k for i in range(n)) / n
    return {"mnn": mnn, "cycle": cyc, "lcs": lcs}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pair(
    seed: int, n: int = 30, da: int = 6, db: int = 5, sets: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two correlated embeddings of the same samples (so alignment is neither 0 nor 1)."""
    g = _gen(seed)
    lead = (n,) if sets is None else (sets, n)
    a = torch.randn(*lead, da, generator=g)
    b = a[..., :db] + 0.5 * torch.randn(*lead, db, generator=g)
    return a, b


# ---------------------------------------------------------------------------------------- separation score


def test_separation_matches_brute_force() -> None:
    g = _gen(0)
    emb = torch.randn(11, 3, generator=g)
    # Uneven classes, including a singleton (3) that has no intra pair and must be skipped in that term.
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
    expected = _bf_separation(emb.tolist(), labels.tolist())
    assert separation_score(emb, labels).item() == pytest.approx(expected, abs=1e-5)

    # Batched episodes give the per-set values; label ids are compared only within a set.
    embs = torch.randn(3, 11, 3, generator=g)
    labs = torch.stack([labels, labels + 7, torch.randint(0, 3, (11,), generator=g)])
    got = separation_score(embs, labs)
    assert got.shape == (3,)
    for s in range(3):
        assert got[s].item() == pytest.approx(_bf_separation(embs[s].tolist(), labs[s].tolist()), abs=1e-5)


def test_separation_known_values() -> None:
    g = _gen(1)
    # Orthogonal clusters (class c on basis vector e_c, random positive lengths): intra 1, inter 0.
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    emb = torch.eye(4)[labels] * (0.1 + torch.rand(9, 1, generator=g))
    assert separation_score(emb, labels).item() == pytest.approx(1.0, abs=1e-6)
    # Two clusters 45 degrees apart: intra 1, inter cos(pi/4), so Sep = 1 - 1/sqrt(2).
    e0, e45 = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]) / math.sqrt(2.0)
    emb = torch.stack([e0, e0, e0, e45, e45]) * torch.tensor([[1.0], [2.0], [3.0], [0.5], [4.0]])
    got = separation_score(emb, torch.tensor([0, 0, 0, 1, 1]))
    assert got.item() == pytest.approx(1.0 - 1.0 / math.sqrt(2.0), abs=1e-6)
    # All points identical: intra = inter = 1.
    emb = torch.randn(1, 5, generator=g).expand(12, 5)
    assert separation_score(emb, torch.arange(12) % 3).item() == pytest.approx(0.0, abs=1e-6)


def test_separation_scale_invariance_and_degenerate_sets() -> None:
    g = _gen(2)
    emb = torch.randn(4, 20, 8, generator=g)
    labels = torch.randint(0, 3, (4, 20), generator=g)
    scale = 0.01 + 100.0 * torch.rand(4, 20, 1, generator=g)
    torch.testing.assert_close(separation_score(emb * scale, labels), separation_score(emb, labels))

    # A zero vector has cosine 0 with everything; it must not produce NaN.
    emb0 = emb[0].clone()
    emb0[3] = 0.0
    assert torch.isfinite(separation_score(emb0, labels[0]))
    # One class: the inter term is undefined. All singletons: the intra term is undefined.
    assert torch.isnan(separation_score(emb[0], torch.zeros(20, dtype=torch.long)))
    assert torch.isnan(separation_score(emb[0], torch.arange(20)))


def test_separation_metric_skips_undefined_sets() -> None:
    g = _gen(3)
    emb = torch.randn(5, 10, 4, generator=g)
    labels = torch.randint(0, 2, (5, 10), generator=g)
    labels[1] = 0  # a single-class episode: NaN, must be skipped and counted, not averaged as 0
    per_set = separation_score(emb, labels)
    metric = SeparationScore()
    metric.update(emb, labels)
    expected = per_set[~per_set.isnan()].mean()
    torch.testing.assert_close(metric.compute(), expected)
    assert metric.count.item() == 4 and metric.skipped.item() == 1


def test_mean_over_sets_reads_nothing_back_on_an_accelerator() -> None:
    """On an accelerator's branch (``as_on_cuda``) update and compute make no host read (each would be a device
    sync on a GPU). Without undefined sets the state is bit for bit the CPU's masked sum; with one, the mean of
    the defined sets either way."""
    from lit_icl.callbacks.host_reads import as_on_cuda
    from lit_icl.core.syncs import host_reads

    emb = torch.randn(6, 12, 4, generator=_gen(5))
    labels = torch.randint(0, 3, (6, 12), generator=_gen(6))
    single = labels.clone()
    single[2] = 1  # an episode of one class: its separation score is undefined
    a, b = _pair(7, n=12, sets=6)
    cases = [(SeparationScore, {}, (emb, labels)), (SeparationScore, {}, (emb, single)),
             (MutualKNN, {"k": 3}, (a, b)), (LCSKNN, {"k": 3}, (a, b))]
    for cls, kw, args in cases:
        on_cpu, on_gpu = cls(**kw), cls(**kw)
        for _ in range(2):
            on_cpu.update(*args)
        with as_on_cuda(), host_reads() as reads:
            for _ in range(2):
                on_gpu.update(*args)
            value = on_gpu.compute()
        assert reads.total == 0, reads.counts
        scores = cls._score(*args, **kw) if cls is not SeparationScore else separation_score(*args)
        defined = scores[~scores.isnan()]
        torch.testing.assert_close(value, defined.mean(), rtol=1e-6, atol=0)
        assert torch.equal(on_gpu.count, on_cpu.count) and on_gpu.count == 2 * len(defined)
        if len(defined) == len(scores):
            assert torch.equal(on_gpu.total, on_cpu.total) and torch.equal(value, on_cpu.compute())


# ---------------------------------------------------------------------------------------- k-NN alignment


def test_knn_indices_matches_brute_force_order(monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = _pair(4, n=25)
    expected = _bf_knn(a.tolist(), 6)
    got = knn_indices(a * 3.0, 6)  # scale must not matter: cosine similarity
    assert got.tolist() == expected
    assert (got != torch.arange(25).unsqueeze(1)).all()  # never its own neighbour
    # Row blocks (used for large pooled sets) must mask the right diagonal entries.
    monkeypatch.setattr("lit_icl.metrics.functional._KNN_ROW_BLOCK", 7)
    assert knn_indices(a, 6).tolist() == expected


def test_alignment_self_is_one() -> None:
    a, _ = _pair(5, sets=3)
    for fn in (mutual_knn, cycle_knn, lcs_knn):
        torch.testing.assert_close(fn(a, a, 5), torch.ones(3))
        assert fn(a[0], a[0], 5).item() == pytest.approx(1.0)


@pytest.mark.parametrize("k", [1, 4, 10])
def test_alignment_matches_brute_force(k: int) -> None:
    a, b = _pair(6 + k, n=30)
    ref = _bf_alignment(a, b, k)
    assert 0.0 < ref["mnn"] < 1.0  # the data must make the comparison informative
    assert mutual_knn(a, b, k).item() == pytest.approx(ref["mnn"], abs=1e-6)
    assert cycle_knn(a, b, k).item() == pytest.approx(ref["cycle"], abs=1e-6)
    assert lcs_knn(a, b, k).item() == pytest.approx(ref["lcs"], abs=1e-6)
    # cycle_knn is asymmetric: the brute force with swapped roles must match the swapped call.
    assert cycle_knn(b, a, k).item() == pytest.approx(_bf_alignment(b, a, k)["cycle"], abs=1e-6)


def test_lcs_matches_textbook_dp() -> None:
    g = _gen(7)
    # Small alphabets make long, non-trivial common subsequences; unequal lengths check the indexing.
    for la, lb, vocab in [(10, 10, 4), (7, 12, 3), (10, 10, 30), (1, 5, 2)]:
        x = torch.randint(0, vocab, (300, la), generator=g)
        y = torch.randint(0, vocab, (300, lb), generator=g)
        got = longest_common_subsequence(x, y)
        assert got.tolist() == [_bf_lcs(r, s) for r, s in zip(x.tolist(), y.tolist())]
    # Leading dims are preserved.
    assert longest_common_subsequence(x.view(3, 100, la), y.view(3, 100, lb)).shape == (3, 100)


def test_alignment_invariances() -> None:
    a, b = _pair(8, n=40, da=6, db=6, sets=2)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=_gen(9)))
    perm = torch.randperm(40, generator=_gen(10))
    for fn in (mutual_knn, cycle_knn, lcs_knn):
        base = fn(a, b, 5)
        torch.testing.assert_close(fn(a @ q, b, 5), base)  # orthogonal rotation of A
        torch.testing.assert_close(fn(a[:, perm], b[:, perm], 5), base)  # same sample order change
        # Batched == per set.
        torch.testing.assert_close(torch.stack([fn(a[s], b[s], 5) for s in range(2)]), base)
    # LCS needs the same neighbours in the same order, so it never exceeds mutual-kNN.
    assert (lcs_knn(a, b, 5) <= mutual_knn(a, b, 5)).all()


def test_scores_from_shared_neighbour_lists_equal_scores_from_embeddings() -> None:
    """Neighbour lists found once and passed to each score give the same scores, bit for bit, batched or not."""
    a, b = _pair(12, n=30, da=5, db=3, sets=3)
    for fn in (mutual_knn, cycle_knn, lcs_knn):
        shared = (knn_indices(a, 4), knn_indices(b, 4))
        assert torch.equal(fn(a, b, 4, shared), fn(a, b, 4)), fn.__name__
        one = (knn_indices(a[1], 4), knn_indices(b[1], 4))
        assert torch.equal(fn(a[1], b[1], 4, one), fn(a[1], b[1], 4)), fn.__name__
    for cls in (MutualKNN, CycleKNN, LCSKNN):
        with_lists, without = cls(k=4), cls(k=4)
        with_lists.update(a, b, neighbours=(knn_indices(a, 4), knn_indices(b, 4)))
        without.update(a, b)
        assert torch.equal(with_lists.compute(), without.compute()), cls.__name__


def test_neighbour_lists_of_the_wrong_shape_are_refused() -> None:
    a, b = _pair(13, n=12, sets=2)
    with pytest.raises(ValueError, match=r"neighbours of A .*k=3.*\(2, 12, 3\).*\(2, 12, 4\)"):
        mutual_knn(a, b, 3, (knn_indices(a, 4), knn_indices(b, 3)))  # lists found with another k
    with pytest.raises(ValueError, match=r"neighbours of B .*\(2, 12, 3\)"):
        cycle_knn(a, b, 3, (knn_indices(a, 3), knn_indices(b[0], 3)))  # one set's lists for a batch
    with pytest.raises(ValueError, match="int64"):
        lcs_knn(a, b, 3, (knn_indices(a, 3).int(), knn_indices(b, 3)))


def test_k_validation() -> None:
    a, b = _pair(11, n=8)
    with pytest.raises(ValueError, match=r"k=8 .*only 8 points.*k <= 7"):
        knn_indices(a, 8)
    with pytest.raises(ValueError, match="k=0"):
        mutual_knn(a, b, 0)
    for cls in (MutualKNN, CycleKNN, LCSKNN):
        with pytest.raises(ValueError, match="k=0"):
            cls(k=0)
        with pytest.raises(ValueError, match="k=9"):
            cls(k=9).update(a, b)
    with pytest.raises(ValueError, match="same samples"):
        mutual_knn(a, b[:7], 3)


# ---------------------------------------------------------------------------------------- Metric classes


@pytest.mark.filterwarnings("ignore:.*was called before the ``update`` method")
def test_compute_without_data_is_nan() -> None:
    for metric in (SeparationScore(), MutualKNN(), CycleKNN(), LCSKNN()):
        assert torch.isnan(metric.compute())


def test_streaming_equals_one_shot() -> None:
    a, b = _pair(12, n=16, sets=10)
    labels = torch.randint(0, 3, (10, 16), generator=_gen(13))
    chunks = [slice(0, 3), slice(3, 5), slice(5, 10)]
    cases = [
        (SeparationScore, lambda s: (a[s], labels[s]), separation_score(a, labels).mean()),
        (MutualKNN, lambda s: (a[s], b[s]), mutual_knn(a, b, 4).mean()),
        (CycleKNN, lambda s: (a[s], b[s]), cycle_knn(a, b, 4).mean()),
        (LCSKNN, lambda s: (a[s], b[s]), lcs_knn(a, b, 4).mean()),
    ]
    for cls, args, expected in cases:
        kw = {} if cls is SeparationScore else {"k": 4}
        streamed, one_shot = cls(**kw), cls(**kw)
        for s in chunks:
            streamed.update(*args(s))
        streamed.update(*args(0))  # a single (N, D) set counts as one more set
        one_shot.update(*args(slice(None)))
        one_shot.update(*args(0))
        torch.testing.assert_close(streamed.compute(), one_shot.compute(), atol=1e-6, rtol=0)
        # Mean over 11 sets, with set 0 twice.
        per_set_sum = expected * 10 + cls(**kw)(*args(0))
        torch.testing.assert_close(streamed.compute(), per_set_sum / 11, atol=1e-6, rtol=0)
        streamed.reset()
        assert streamed.count.item() == 0


def _ddp_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a, b = _pair(14, n=12, sets=8)
    labels = torch.randint(0, 2, (8, 12), generator=_gen(15))
    labels[6] = 1  # one undefined separation set, on rank 1 only
    return a, b, labels


def _all_metrics(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor) -> list[float]:
    metrics = [
        (SeparationScore(), (a, labels)),
        (MutualKNN(3), (a, b)),
        (CycleKNN(3), (a, b)),
        (LCSKNN(3), (a, b)),
    ]
    out = []
    for metric, args in metrics:
        if args[0].shape[0] > 0:
            metric.update(*args)
        out.append(metric.compute().item())
    return out


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        a, b, labels = _ddp_data()
        mine = slice(0, 3) if rank == 0 else slice(3, 8)  # unequal: 3 and 5 episodes
        torch.save(_all_metrics(a[mine], b[mine], labels[mine]), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_sync_with_unequal_ranks(tmp_path) -> None:
    # "forkserver" rather than "spawn": the server imports torch/torchmetrics once (seconds: torchmetrics
    # pulls in torchvision) and both ranks fork from it, instead of each importing them again on shared cores.
    # Unlike a plain fork of this pytest process, the server has never run an OpenMP region, so forking it is
    # safe. (Preload the installed package, not this test module: Python 3.11's forkserver ignores sys.path.)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["lit_icl.metrics"])
    mp.start_processes(
        _ddp_worker,
        args=(2, str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="forkserver",
    )
    expected = _all_metrics(*_ddp_data())
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got == pytest.approx(expected, abs=1e-6), f"rank {rank}"


# ---------------------------------------------------------------------------------------- callback


@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_callback_logs_functional_values() -> None:
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from lit_icl.callbacks import RepresentationMetrics

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 6)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def _eval_step(self, batch):
            x, y = batch
            return {"embeddings": {"b": x, "a": self.net(x)}, "labels": y}

        def validation_step(self, batch, batch_idx):
            return self._eval_step(batch)

        def test_step(self, batch, batch_idx):
            return self._eval_step(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = _gen(16)
    x_train = torch.randn(4, 10, 4, generator=g)
    x_val = torch.randn(4, 10, 4, generator=g)
    y_val = torch.randint(0, 2, (4, 10), generator=g)
    train = DataLoader(TensorDataset(x_train, torch.zeros(4, 10)), batch_size=2)
    val = DataLoader(TensorDataset(x_val, y_val), batch_size=2)

    model = Tiny()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[RepresentationMetrics(k=3)],
    )
    trainer.fit(model, train, val)

    with torch.no_grad():
        a = model.net(x_val)
    expected = {
        "separation/a": separation_score(a, y_val).mean(),
        "separation/b": separation_score(x_val, y_val).mean(),
        "mnn/a~b": mutual_knn(a, x_val, 3).mean(),
        "cycle_knn/a~b": cycle_knn(a, x_val, 3).mean(),
        "lcs_knn/a~b": lcs_knn(a, x_val, 3).mean(),
    }
    logged = trainer.callback_metrics
    assert {k for k in logged if k.startswith("val/")} == {f"val/{k}" for k in expected}
    for key, value in expected.items():
        assert logged[f"val/{key}"].item() == pytest.approx(value.item(), abs=1e-6), key

    (results,) = trainer.test(model, val, verbose=False)
    for key, value in expected.items():
        assert results[f"test/{key}"] == pytest.approx(value.item(), abs=1e-6), key


def test_representation_metrics_search_each_embedding_once_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three alignment scores of a pair share its two neighbour searches (the costly part of each score)."""
    from lit_icl.callbacks import representation
    from lit_icl.metrics import functional

    searched: list[tuple[int, ...]] = []
    real = functional.knn_indices

    def counted(feats: torch.Tensor, k: int) -> torch.Tensor:
        searched.append(tuple(feats.shape))
        return real(feats, k)

    monkeypatch.setattr(representation, "knn_indices", counted)
    monkeypatch.setattr(functional, "knn_indices", counted)  # a score that searched again would count here
    callback = representation.RepresentationMetrics(k=3)
    x = torch.randn(2, 10, 4, generator=_gen(17))
    outputs = {"embeddings": {"a": x, "b": x.flip(-1), "c": x[..., :2]}}
    trainer, module = SimpleNamespace(sanity_checking=False), SimpleNamespace(device=torch.device("cpu"))
    callback.on_validation_batch_end(trainer, module, outputs, None, 0)
    assert sorted(searched) == [(2, 10, 2), (2, 10, 4), (2, 10, 4)]  # a, b, c once each, for 3 pairs x 3 scores
