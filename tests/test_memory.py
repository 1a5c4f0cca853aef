"""distlab.measure.memory: saved-tensor bytes, and the same bytes split into activations and weights."""
from __future__ import annotations

import torch
from torch import nn

from distlab.measure.memory import saved_tensor_bytes, saved_tensor_bytes_by_kind


def _mlp_step(model: nn.Module, x: torch.Tensor, dtype: torch.dtype | None):
    def fn():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(x).float().pow(2).mean()
        loss.backward()
    return fn


def test_float32_weights_are_parameters_and_the_rest_matches_the_parameter_free_count():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fn = _mlp_step(model, torch.randn(4, 16), None)
    kinds = saved_tensor_bytes_by_kind(fn, model.parameters())
    assert kinds["parameters"] == 32 * 8 * 4  # the second linear saves its weight; the first needs none
    assert kinds["parameter copies"] == 0
    assert kinds["activations"] == saved_tensor_bytes(fn, exclude=list(model.parameters()))
    assert sum(kinds.values()) == saved_tensor_bytes(fn)


def test_autocast_copies_of_the_weights_are_counted_apart_from_the_activations():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    fp32 = saved_tensor_bytes_by_kind(_mlp_step(model, x, None), model.parameters())
    bf16 = saved_tensor_bytes_by_kind(_mlp_step(model, x, torch.bfloat16), model.parameters())
    assert bf16["parameters"] == 0 and bf16["parameter copies"] == fp32["parameters"] // 2
    assert bf16["activations"] < fp32["activations"]
    # the parameter-free count of saved_tensor_bytes cannot see the copies: they are new storages
    assert saved_tensor_bytes(_mlp_step(model, x, torch.bfloat16), exclude=list(model.parameters())) \
        == bf16["activations"] + bf16["parameter copies"]


def test_a_tensor_computed_from_a_parameter_and_an_input_is_an_activation():
    w = nn.Parameter(torch.randn(8))
    x = torch.randn(8)
    kinds = saved_tensor_bytes_by_kind(lambda: torch.sin(w * x).sum().backward(), [w])
    # mul saves x (for the gradient of w), sin saves w * x: both activations, though w * x comes from w
    assert kinds == {"activations": 2 * 8 * 4, "parameters": 0, "parameter copies": 0}
