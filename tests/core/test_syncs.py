"""``lit_icl.core.syncs``: the census of host reads that a GPU run would wait on, checked against calls whose
behaviour on CUDA is known (``item`` reads, ``torch.where`` does not)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.callbacks.host_reads import as_on_cuda
from lit_icl.core import spectral
from lit_icl.core.optim import fused_if_cuda
from lit_icl.core.syncs import host_reads, not_counted


def test_each_kind_of_host_read_is_counted_once() -> None:
    x = torch.randn(6)
    with host_reads() as reads:
        x.sum().item()
        bool(x[0] > 0)
        float(x.max())
        x[x > 0]
        y = x.clone()
        y[y > 0] = torch.tensor(0.0)  # a tensor value: torch 2.15 turns a Python number into masked_fill_
        torch.nonzero(x)
        x.unique()
        x.tolist()
        x.cpu()
        x.numpy()
        torch.repeat_interleave(torch.tensor([1, 2]))
    assert dict(reads.counts) == {
        "aten._local_scalar_dense": 3, "aten.index[mask]": 1, "aten.index_put_[mask]": 1, "aten.nonzero": 1,
        "aten._unique2": 1, "Tensor.tolist": 1, "Tensor.cpu": 1, "Tensor.numpy": 1,
        "aten.repeat_interleave(no output_size)": 1,
    }
    assert reads.total == 11


def test_work_that_stays_on_the_device_is_not_counted() -> None:
    x = torch.randn(5, 4, requires_grad=True)
    idx = torch.tensor([0, 2])
    with host_reads() as reads:
        y = torch.where(x > 0, x, 0.0).sum(0)
        z = x[idx] * x[1:3]  # integer indexing and slicing: sizes known on the host
        w = F.one_hot(idx, 5)  # noqa: F841  (its CPU-only range check is counted: see as_on_cuda)
        torch.repeat_interleave(x, 2, dim=0)  # an integer count: the size is known
        torch.repeat_interleave(x, torch.tensor([1, 2, 0, 1, 1]), dim=0, output_size=5)
        (y.sum() + z.sum()).backward()
    # F.one_hot's two CPU reads are all there is.
    assert dict(reads.counts) == {"aten._local_scalar_dense": 2}


def test_reads_inside_not_counted_and_inside_a_data_loader_are_left_out() -> None:
    loader = DataLoader([torch.tensor([i, i + 1]) for i in range(4)], batch_size=2,
                        collate_fn=lambda items: torch.stack(items)[torch.stack(items)[:, 0] >= 0])
    with host_reads(sites=True) as reads:
        batches = list(loader)
        with not_counted():
            batches[0].sum().item()
        batches[1].sum().item()
    assert dict(reads.counts) == {"aten._local_scalar_dense": 1}
    ((kind, site),) = reads.sites
    assert kind == "aten._local_scalar_dense" and site.endswith("in test_reads_inside_not_counted_and_inside_a_data_loader_are_left_out")
    assert __file__ in site


def test_tensor_methods_are_restored_on_exit() -> None:
    methods = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu", "numpy")}
    with host_reads():
        assert torch.Tensor.tolist is not methods["tolist"]
    assert {name: getattr(torch.Tensor, name) for name in methods} == methods
    with host_reads() as reads:
        pass
    torch.ones(2).tolist()
    assert reads.total == 0


def test_as_on_cuda_takes_the_cuda_branches_and_restores_them() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    lap = torch.eye(40).expand(3, 40, 40)
    assert fused_if_cuda(params) == {} and not spectral.eigh_on_host(lap.shape, torch.device("cpu"))
    one_hot, defers = F.one_hot, FiniteGuard._defers
    with as_on_cuda():
        import lit_icl.core.optim as optim_module  # the name the papers import is patched in their own modules
        from lit_icl.icssl import module as icssl_module

        assert icssl_module.fused_if_cuda(params) == {"fused": True}
        assert optim_module.fused_if_cuda(params) == {"fused": True}
        assert FiniteGuard._defers(torch.device("cpu"))
        assert spectral.eigh_on_host(lap.shape, torch.device("cpu"))
        assert not spectral.eigh_on_host(torch.eye(20).expand(3, 20, 20).shape, torch.device("cpu"))
        with host_reads() as reads:
            F.one_hot(torch.tensor([0, 2]), 3)
            F.one_hot(torch.tensor([0, 2]))  # without a class count it reads the data's maximum on CUDA too
        assert dict(reads.counts) == {"aten._local_scalar_dense": 2}
    assert F.one_hot is one_hot and FiniteGuard._defers is defers
    assert icssl_module.fused_if_cuda(params) == {}
    assert not spectral.eigh_on_host(lap.shape, torch.device("cpu"))
