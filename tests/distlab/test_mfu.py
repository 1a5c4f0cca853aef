"""FLOPs counted against Kaplan's 6N rule, the datasheet table, and the MFU arithmetic (distlab.lab.mfu).

Counts are exact (FlopCounterMode counts matrix products by their shapes); no speed is asserted.
"""
import pytest
import torch

from distlab.lab.mfu import (datasheet_peak, exact_mlp_flops, hardware_flops_per_token, matmul_peak, mfu, six_n_rule,
                             step_flops, training_seconds)
from distlab.models import make_mlp
from distlab.resmlp import make_resmlp


def _batch(n, features=64, classes=10):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize("model", [make_resmlp(0), make_mlp(0, hidden=1024, depth=3)], ids=["resmlp", "ex06-mlp"])
def test_counted_flops_are_6n_less_biases_and_the_first_layers_input_gradient(model):
    x, y = _batch(32)
    counted = step_flops(model, x, y)
    assert counted == exact_mlp_flops(model, 32)
    # What 6N counts and the counter does not: 6 FLOPs per bias and token (adds, not matrix
    # products), and 2 per first-layer weight and token (that layer's input needs no gradient).
    biases = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).weight.numel()
    assert six_n_rule(model, 32) - counted == 6 * biases * 32 + 2 * first * 32
    assert counted / six_n_rule(model, 32) == pytest.approx(1, abs=0.02)


def test_full_recomputation_adds_one_forward_to_the_hardware_flops_not_the_model_flops():
    """HFU's 8N against MFU's 6N: the counter sees the recomputed forward (2 FLOPs per weight and token)."""
    inner = make_mlp(0, hidden=128, depth=2)

    class Recomputed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)

    x, y = _batch(16)
    # the whole forward again, as Megatron recomputes (PyTorch's early stop would skip the head's matmul,
    # whose output nothing saved needs)
    weights = sum(m.weight.numel() for m in inner.modules() if isinstance(m, torch.nn.Linear))
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        recomputed = step_flops(Recomputed(), x, y)
    assert recomputed - step_flops(inner, x, y) == 2 * weights * 16
    assert hardware_flops_per_token(1e9, "full") / hardware_flops_per_token(1e9) == pytest.approx(8 / 6)
    with pytest.raises(ValueError):
        hardware_flops_per_token(1e9, "some")


def test_step_flops_leaves_no_gradients_behind():
    model = make_resmlp(0)
    step_flops(model, *_batch(4))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H200", torch.bfloat16, 989e12),
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
    ("NVIDIA H100 PCIe", torch.float32, 51e12),
    ("NVIDIA A100-SXM4-80GB", torch.float32, 19.5e12),
    ("NVIDIA L4", torch.bfloat16, 121e12),
    ("NVIDIA L40S", torch.bfloat16, None),   # not L4: not in the table
    ("cpu", torch.float32, None),
])
def test_datasheet_peaks_by_device_name(name, dtype, peak):
    assert datasheet_peak(name, dtype) == peak


def test_mfu_is_achieved_over_peak():
    assert mfu(flops_per_step=2e9, step_s=0.1, peak_flops_per_s=40e9) == pytest.approx(0.5)
    best = matmul_peak(sizes=(32, 64), reps=1)
    assert best["flops_per_s"] > 0 and best["n"] in (32, 64) and best["dtype"] == "fp32"


def test_training_time_from_six_n_d_matches_a_published_run():
    # Llama 2 7B (Touvron et al., 2023, Table 2): 6.74e9 parameters, 2.0e12 tokens, 184,320 A100-80GB GPU-hours.
    # At A100's 312 TFLOP/s bf16 peak that is an MFU of 0.39: the formula gives the published hours back.
    published_s = 184_320 * 3600
    implied_mfu = 6 * 6.74e9 * 2.0e12 / (published_s * 312e12)
    assert implied_mfu == pytest.approx(0.391, abs=0.001)
    got = training_seconds(6.74e9, 2.0e12, peak_flops_per_s=312e12, mfu=implied_mfu, gpus=1)
    assert got == pytest.approx(published_s)
    assert training_seconds(6.74e9, 2.0e12, peak_flops_per_s=312e12, mfu=implied_mfu, gpus=1024) == \
        pytest.approx(published_s / 1024)
    with pytest.raises(ValueError, match="fraction"):
        training_seconds(1e9, 1e9, peak_flops_per_s=1e12, mfu=40)
