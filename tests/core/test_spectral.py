"""Where :func:`lit_icl.core.spectral.symmetric_eigenvectors` solves a batch, and that it solves it right.

On a CUDA device torch solves a batch of symmetric matrices larger than 32 x 32 one matrix at a time; those
batches go to the host. The CPU path must stay ``torch.linalg.eigh`` itself (CPU numbers do not change).
"""

from __future__ import annotations

import pytest
import torch

from lit_icl.core.spectral import eigh_on_host, symmetric_eigenvectors

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def _symmetric(*shape: int, seed: int = 0) -> torch.Tensor:
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return (a + a.mT) / 2


@pytest.mark.parametrize(("shape", "device", "host"), [
    ((64, 100, 100), CUDA, True),    # IC-SSL's EIG reference: a batch of 100-point Laplacians
    ((2, 3, 40, 40), CUDA, True),    # several batch axes count together
    ((64, 33, 33), CUDA, True),      # the first size torch does not batch
    ((64, 32, 32), CUDA, False),     # torch's batched Jacobi solver takes these
    ((100, 100), CUDA, False),       # one matrix: one solver call either way
    ((1, 100, 100), CUDA, False),
    ((64, 100, 100), CPU, False),    # already on the host
])
def test_which_batches_are_solved_on_the_host(shape, device, host) -> None:
    assert eigh_on_host(torch.Size(shape), device) is host


def test_on_the_cpu_it_is_torch_eigh_to_the_bit() -> None:
    lap = _symmetric(8, 50, 50)
    assert torch.equal(symmetric_eigenvectors(lap), torch.linalg.eigh(lap).eigenvectors)


def test_eigenvectors_diagonalise_the_matrices_in_ascending_order() -> None:
    """An independent check in float64: ``V^T A V`` is diagonal with ascending entries, ``V`` orthonormal."""
    a = _symmetric(4, 40, 40, seed=1)
    v = symmetric_eigenvectors(a).double()
    d = v.mT @ a.double() @ v
    diag = torch.diagonal(d, dim1=-2, dim2=-1)
    torch.testing.assert_close(d, torch.diag_embed(diag), atol=1e-4, rtol=0)
    torch.testing.assert_close(v.mT @ v, torch.eye(40, dtype=torch.float64).expand(4, 40, 40), atol=1e-5, rtol=0)
    assert (diag.diff(dim=-1) >= -1e-5).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_suite.py runs it)")
def test_a_cuda_batch_comes_back_on_the_device_with_the_host_result() -> None:
    lap = _symmetric(64, 100, 100).cuda()
    vecs = symmetric_eigenvectors(lap)
    assert vecs.device == lap.device
    assert torch.equal(vecs.cpu(), torch.linalg.eigh(lap.cpu()).eigenvectors)
