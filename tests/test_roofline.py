"""``benchmarks/roofline.py``: the work it counts per op against formulas written here, and its bounds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def roofline():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # it imports step_speed and launches_per_step beside it
    return load_script(BENCHMARKS / "roofline.py")


def test_a_convolution_and_a_linear_layer_count_their_flops_and_bytes(roofline) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(4, 3, 10, 10, requires_grad=True)
    counter = roofline.WorkCounter()
    with counter:
        y = conv(x)  # (4, 8, 10, 10)
        z = lin(y.mean(dim=(2, 3)))  # (4, 5)
    ops = counter.ops
    # Forward convolution: 2 * N * C_out * H * W * C_in * k * k; it reads x and the weight, writes y.
    assert ops["convolution"].calls == 1
    assert ops["convolution"].flops == 2 * 4 * 8 * 10 * 10 * 3 * 3 * 3
    assert ops["convolution"].bytes == 4 * (x.numel() + conv.weight.numel() + y.numel())
    # The linear layer is one addmm: 2 * N * in * out; reads bias, input, weight^T, writes z.
    assert ops["addmm"].flops == 2 * 4 * 8 * 5
    assert ops["addmm"].bytes == 4 * (5 + 4 * 8 + 8 * 5 + z.numel())
    # The transpose of the weight only makes a view: no kernel, not counted.
    assert "t" not in ops and "transpose" not in ops
    assert ops["mean"].flops == 0 and ops["mean"].bytes == 4 * (y.numel() + 4 * 8)
    # The backward of the convolution is counted as what it launches: grad input and grad weight, 2 x forward.
    with counter:
        z.sum().backward()
    assert ops["convolution_backward"].flops == 2 * ops["convolution"].flops


def test_fused_attention_on_the_cpu_counts_the_flops_of_its_two_products(roofline) -> None:
    """Torch's FLOP table lacks the CPU's fused attention; it is counted as the GPU's: QK^T and PV forward."""
    b, h, n, d = 2, 4, 16, 8
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    counter = roofline.WorkCounter()
    with counter:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
    fwd = [r for name, r in counter.ops.items() if "attention" in name and "backward" not in name]
    bwd = [r for name, r in counter.ops.items() if "attention" in name and "backward" in name]
    assert len(fwd) == 1 and len(bwd) == 1, sorted(counter.ops)
    assert fwd[0].flops == 2 * (2 * b * h * n * n * d)
    assert bwd[0].flops == 5 * (2 * b * h * n * n * d)  # the scores again, then four products of that size


def test_bounds_take_each_op_at_its_slower_limit_and_add_the_optimizer(roofline) -> None:
    counter = roofline.WorkCounter()
    gpu = {"tf32": 1e12, "bf16": 2e12, "bandwidth": 1e9}
    # A product bound by compute (1e9 flop / 1e12 = 1 ms > 1e5 B / 1e9 = 0.1 ms), one bound by memory in bf16,
    # and an elementwise op (2 ms of memory).
    counter.ops["mm"].per_call.append((1e9, 1e5, False))
    counter.ops["bmm"].per_call.append((1e9, 4e6, True))
    counter.ops["add"].per_call.append((0.0, 2e6, False))
    for name in ("mm", "bmm", "add"):
        counter.ops[name].calls = 1
    b = roofline.bounds(counter, n_params=1000, gpu=gpu, kernel_us=2.0)
    adam = 7 * 4 * 1000 / 1e9 * 1e3  # ms
    assert b["optimizer"] == pytest.approx(adam)
    assert b["roofline"] == pytest.approx(1.0 + 4.0 + 2.0 + adam)
    assert b["products"] == pytest.approx(1.0 + 4.0 + adam)
    assert b["n_kernels"] == 3 and b["kernels"] == pytest.approx(0.006)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_kernel_time_of_zero_or_less_is_refused(roofline, capsys, value: str) -> None:
    """``--kernel-us 0`` printed a kernel floor of 0 ms."""
    with pytest.raises(SystemExit) as exit_:
        roofline.main(["--config", "configs/mmca/synthetic.yaml", f"--kernel-us={value}"])
    assert exit_.value.code == 2
    refusal = ("argument --kernel-us: must be more than 0 microseconds (the least GPU time of one kernel), "
               f"got {value}")
    assert refusal in capsys.readouterr().err
