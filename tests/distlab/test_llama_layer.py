"""A Llama layer's activations (distlab.lab.llama_layer): the per-layer formula against what autograd saves,
to the byte, over shapes with and without grouped-query attention, in bf16 and fp32; beside Korthikanti's GPT
layer. In-process, milliseconds."""
import pytest
import torch

from distlab.lab.activation_memory import transformer_layer_bytes
from distlab.lab.llama_layer import llama_layer_bytes, measured_layer_bytes

SHAPES = [  # seq, batch, hidden, heads, kv_heads, ffn
    (32, 2, 64, 4, 4, 176), (32, 2, 64, 4, 2, 176), (64, 1, 128, 8, 2, 352), (16, 3, 96, 6, 1, 256)]


@pytest.mark.parametrize("dtype, act", [(torch.bfloat16, 2), (torch.float32, 4)])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_formula_is_what_autograd_saves(shape, dtype, act):
    assert measured_layer_bytes(*shape, dtype=dtype) == llama_layer_bytes(*shape, act_bytes=act)


def test_a_llama_2_7b_layer_keeps_more_than_korthikantis_layer_without_scores_and_far_less_than_with():
    s, h, a, f = 4096, 4096, 32, 11008
    llama = llama_layer_bytes(s, 1, h, a, a, f)
    assert transformer_layer_bytes(s, 1, h, a, recompute="selective") < llama < transformer_layer_bytes(s, 1, h, a)
    # grouped-query attention (Llama 3 8B: 8 key/value heads of 32, an MLP of 14336) saves a little on k and v
    assert llama_layer_bytes(8192, 1, h, a, 8, 14336) < llama_layer_bytes(8192, 1, h, a, 32, 14336)
