"""Latent-factor prompts (mmca Sec. 3, App. H): covariance of Eq. (3.2), the Bayes vector of Eq. (3.3),
the distribution of m and zeta, and purity of the generated data."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lit_icl.core.data import SeededChunks, collate_chunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.mmca import LatentFactorDataModule
from lit_icl.mmca.synthetic.data import LatentFactorPrompts, sample_latent_factor_prompts


def test_per_prompt_covariance_matches_eq_3_2() -> None:
    """Monte Carlo: the sample covariance of [x_i; y_i] within one prompt is Sigma(m, zeta) of Eq. (3.2)."""
    d1, d2, L = 3, 2, 40000
    b = sample_latent_factor_prompts(4, L, d1, d2, (0.5, 3.0), make_generator(0, "cov", 0))
    for j in range(4):
        m, zeta = b["m"][j].double(), b["zeta"][j].double()
        d = d1 + d2
        sigma = torch.empty(d + 1, d + 1, dtype=torch.float64)
        sigma[:d, :d] = torch.eye(d, dtype=torch.float64) + torch.outer(m, m)
        sigma[:d, d] = sigma[d, :d] = zeta * m
        sigma[d, d] = zeta**2
        z = torch.cat([b["x"][j], b["y"][j].unsqueeze(-1)], dim=-1).double()  # (L, d+1), mean zero by design
        emp = z.T @ z / L
        # Std of a Gaussian sample covariance entry: sqrt((S_aa S_bb + S_ab^2) / L); allow 5 standard errors.
        se = ((sigma.diagonal().outer(sigma.diagonal()) + sigma**2) / L).sqrt()
        assert ((emp - sigma).abs() <= 5 * se + 1e-9).all(), (emp - sigma).abs().max()
        # Rank-one spike: the top eigenvalue of the covariate block is 1 + ||m||^2 (App. A notation, Z).
        top = torch.linalg.eigvalsh(emp[:d, :d])[-1]
        assert abs(top - (1 + m.dot(m))) < 0.05 * (1 + m.dot(m))


def test_query_token_follows_eq_3_1_like_the_context() -> None:
    """x_q - u_q m (with u_q = y_q / zeta) is N(0, I) noise and u_q ~ N(0, 1), as for context tokens."""
    n = 20000
    b = sample_latent_factor_prompts(n, 3, 2, 2, (0.0, 5.0), make_generator(1, "q", 0))
    assert b["x"].shape == (n, 3, 4) and b["y"].shape == (n, 3) and b["x"].dtype == torch.float32
    assert b["x_query"].shape == (n, 4) and b["y_query"].shape == (n,)
    for xs, ys in ((b["x_query"], b["y_query"]), (b["x"][:, 1], b["y"][:, 1])):
        u = (ys / b["zeta"]).double()
        noise = xs.double() - u.unsqueeze(-1) * b["m"].double()
        assert abs(float(u.mean())) < 0.04 and abs(float(u.var()) - 1) < 0.05
        assert noise.mean(0).abs().max() < 0.04
        assert (noise.T @ noise / n - torch.eye(4, dtype=torch.float64)).abs().max() < 0.05
        # The latent is shared: noise is uncorrelated with u.
        assert (noise * u.unsqueeze(-1)).mean(0).abs().max() < 0.04


def test_norm_direction_and_zeta_distributions() -> None:
    n = 20000
    b = sample_latent_factor_prompts(n, 1, 16, 16, (1.0, 4.0), make_generator(2, "dist", 0))
    norms = b["m"].norm(dim=-1)
    assert norms.min() >= 1.0 - 1e-5 and norms.max() <= 4.0 + 1e-5
    # Uniform on [1, 4]: the empirical CDF at quarter points is within 4 binomial standard errors.
    for q in (0.25, 0.5, 0.75):
        frac = float((norms <= 1.0 + 3.0 * q).float().mean())
        assert abs(frac - q) < 4 * math.sqrt(q * (1 - q) / n)
    # Spherical direction: mean ~ 0, second moment ~ I/d.
    u = b["m"] / norms.unsqueeze(-1)
    assert u.mean(0).abs().max() < 4 / math.sqrt(32 * n) * 1.5 + 0.01
    assert (u.T @ u / n - torch.eye(32) / 32).abs().max() < 0.01
    z = b["zeta"]
    assert abs(float(z.mean())) < 4 / math.sqrt(n) and abs(float(z.var()) - 1) < 0.05


def _dm(**kw) -> LatentFactorDataModule:
    args = {
        "d1": 2,
        "d2": 2,
        "train_context_length": 8,
        "train_prompts": 32,
        "batch_size": 16,
        "chunk_size": 8,
        "train_batches_per_epoch": 4,
        "val_prompts": 8,
        "test_prompts": 16,
        "test_context_lengths": [4, 12],
        "eval_batch_size": 8,
    }
    args.update(kw)
    return LatentFactorDataModule(**args)


def _epoch(dm: LatentFactorDataModule, epoch: int) -> list[dict[str, torch.Tensor]]:
    """An epoch's training batches as the step gets them (after the data module's transfer hook)."""
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [dm.on_after_batch_transfer(batch, 0) for batch in loader]


def test_fixed_training_set_ships_chunk_keys_and_gathers_the_same_prompts() -> None:
    """The fixed set crosses to the device once: the loader yields chunk keys only, and the gathered batches are
    bit for bit the collated ``train_fixed`` chunks that the loader used to yield (same prompts, same order), on
    one process and on each of two DDP ranks."""
    for world, rank in ((1, 0), (2, 0), (2, 1)):
        dm = _dm()
        dm.trainer = SimpleNamespace(world_size=world, global_rank=rank, strategy=SimpleNamespace(
            root_device=torch.device("cpu")), fit_loop=SimpleNamespace(epoch_progress=SimpleNamespace(
                current=SimpleNamespace(processed=0))))
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(1)
        chunks = LatentFactorPrompts("train_fixed", 4, 8, 8, 2, 2, (0.0, 5.0), 0, cycle=4)
        indices = list(loader.sampler)  # this rank's items, two chunks of 8 prompts per batch of 16
        assert len(indices) == 4 * 2
        for batch, items in zip(loader, (indices[i : i + 2] for i in range(0, len(indices), 2)), strict=True):
            assert batch.keys() == {"chunk"} and batch["chunk"].tolist() == [i % 4 for i in items]
            expected = collate_chunks([chunks[i] for i in items])
            got = dm.on_after_batch_transfer(batch, 0)
            assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
    # The set is made once and kept: a second batch reuses the same tensors.
    bank = dm.fixed_training_set.tensors(torch.device("cpu"))
    assert bank["x"].shape == (4, 8, 8, 4) and bank["x"] is dm.fixed_training_set.tensors(torch.device("cpu"))["x"]


def test_fixed_training_set_repeats_and_fresh_prompts_do_not() -> None:
    fixed = _dm()
    e0, e1 = _epoch(fixed, 0), _epoch(fixed, 1)
    assert len(e0) == 4 and e0[0]["x"].shape == (16, 8, 4)
    # N = 32 prompts, 16 per step: steps 0/2 and 1/3 see the same prompts; epochs repeat them.
    assert torch.equal(e0[0]["x"], e0[2]["x"]) and torch.equal(e0[1]["x"], e1[1]["x"])
    assert not torch.equal(e0[0]["x"], e0[1]["x"])
    # The fixed set is a pure function of the seed: a second data module regenerates it bit for bit.
    assert torch.equal(_epoch(_dm(), 3)[0]["y"], e0[0]["y"])
    fresh = _dm(train_prompts=None)
    f0, f1 = _epoch(fresh, 0), _epoch(fresh, 1)
    assert not torch.equal(f0[0]["x"], f0[2]["x"]) and not torch.equal(f0[0]["x"], f1[0]["x"])
    assert torch.equal(_epoch(_dm(train_prompts=None), 1)[0]["x"], f1[0]["x"])
    assert not torch.equal(_epoch(_dm(data_seed=1), 0)[0]["x"], e0[0]["x"])


def test_fresh_prompts_drawn_after_the_transfer_equal_the_loaders_on_the_cpu() -> None:
    """``generate_on_device``: the loader moves one seed per chunk, read on the host before the transfer, and the
    prompts drawn from them are bit for bit those the loader draws itself (on the CPU; a GPU draws its own)."""
    on_device, in_loader = _dm(train_prompts=None), _dm(train_prompts=None, generate_on_device=False)
    shipped = next(iter(on_device.train_dataloader()))
    assert shipped.keys() == {"seed"} and shipped["seed"].shape == (2,)
    before = on_device.on_before_batch_transfer(dict(shipped), 0)
    assert before["host_seeds"] == shipped["seed"].tolist()
    for epoch in (0, 2):
        drawn, made = _epoch(on_device, epoch), _epoch(in_loader, epoch)
        assert len(drawn) == len(made) == 4
        for a, b in zip(drawn, made, strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)
    hooked = on_device.on_after_batch_transfer(before, 0)
    assert all(torch.equal(hooked[k], drawn_k) for k, drawn_k in _epoch(on_device, 0)[0].items())


def test_eval_sets_are_fixed_and_test_prompts_have_the_longest_context() -> None:
    dm = _dm()
    t1, t2 = list(dm.test_dataloader()), list(dm.test_dataloader())
    assert t1[0]["x"].shape == (8, 12, 4) and len(t1) == 2
    assert torch.equal(t1[1]["x"], t2[1]["x"])
    assert next(iter(dm.val_dataloader()))["x"].shape == (8, 8, 4)
    assert dm.d == 4 and dm.alpha_star == pytest.approx(2 / 27)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"d1": 0}, "d1=0 must be >= 1; 16 in App. H"),
        ({"norm_range": (3.0, 1.0)}, "norm_range=(3.0, 1.0) must be (low, high) with low < high"),
        ({"norm_range": (-1.0, 1.0)}, "norm_range=(-1.0, 1.0): both ends must lie in [0, inf)"),
        ({"batch_size": 12}, "batch_size=12 must be a positive multiple of chunk_size=8"),
        ({"train_prompts": 40, "batch_size": 16}, "must divide train_prompts=40"),
        ({"test_context_lengths": []}, "test_context_lengths is empty"),
        ({"test_context_lengths": [4, 4]}, "repeats 4; list each value once"),
        ({"train_context_length": 0}, "train_context_length=0"),
    ],
)
def test_bad_data_arguments(kw, needle) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        _dm(**kw)
    assert needle in str(info.value)


def test_chunks_are_seeded_chunks_bit_identical_to_the_old_generator_keys() -> None:
    """``LatentFactorPrompts`` is a ``SeededChunks`` whose item ``i`` is generated from
    ``make_generator(data_seed, split, i mod cycle)``, exactly as before the base class existed."""
    fixed = LatentFactorPrompts("train_fixed", 10, 8, 6, 2, 3, (0.0, 5.0), 7, cycle=4)
    fresh = LatentFactorPrompts("train", 10, 8, 6, 2, 3, (0.0, 5.0), 7)
    assert (
        isinstance(fixed, SeededChunks)
        and fixed.keys(5) == ("train_fixed", 1)
        and fresh.keys(5) == ("train", 5)
    )
    for ds, index, key in ((fixed, 5, 1), (fixed, 9, 1), (fresh, 9, 9)):
        ref = sample_latent_factor_prompts(8, 6, 2, 3, (0.0, 5.0), make_generator(7, ds.split, key))
        item = ds[index]
        assert item.keys() == ref.keys() and all(torch.equal(item[k], ref[k]) for k in ref)
    # Sums of item 5 of the fixed set as the code of commit 93c16ee (before SeededChunks) generated it.
    old = {"x": 0.38147827610373497, "y": -4.415387532673776, "x_query": 3.1217003166675568,
           "y_query": -4.8799044117331505, "m": 7.161872403463349, "zeta": -3.765404999256134}  # fmt: skip
    assert {k: float(v.double().sum()) for k, v in fixed[5].items()} == old
