"""The course's one memory accounting (distlab.lab.training_memory) against the ZeRO paper's figures,
and the callers that must agree with it (fsdp_memory.memory_per_gpu, activation_memory.per_rank)."""
import re

import jupytext
import pytest

from distlab.lab.activation_memory import per_rank, transformer_layer_bytes
from distlab.lab.fsdp_memory import memory_per_gpu
from distlab.lab.training_memory import LEVELS, bytes_per_param, training_memory
from tests.helpers.notebook_exec import COURSE

GB = 1e9


def test_adam_costs_16_bytes_a_parameter_in_fp32_and_in_bf16_mixed_precision():
    assert bytes_per_param("fp32") == {"params": 4, "grads": 4, "master": 0, "optimizer": 8}
    assert bytes_per_param("bf16") == {"params": 2, "grads": 2, "master": 4, "optimizer": 8}  # 2 + 2 + K, K = 12
    assert sum(bytes_per_param("bf16").values()) == sum(bytes_per_param("fp32").values()) == 16
    assert sum(bytes_per_param("bf16", "sgd").values()) == 8  # the master copy stays without moments
    with pytest.raises(ValueError):
        bytes_per_param("int8")


def test_zero_paper_7_5b_example():
    """Rajbhandari et al. (2020), Figure 1: Ψ = 7.5B, K = 12, N_d = 64."""
    psi = 7.5e9
    assert training_memory(psi, precision="bf16")["total"] == pytest.approx(120 * GB)
    per_stage = [training_memory(psi, precision="bf16", world=64, level=lv)["total"] / GB for lv in LEVELS]
    assert [round(x, 1) for x in per_stage] == [120.0, 31.4, 16.6, 1.9]
    assert per_stage[1] == pytest.approx((2 + 2 + 12 / 64) * 7.5)  # ZeRO-1 divides master and moments
    assert per_stage[2] == pytest.approx((2 + 14 / 64) * 7.5)


def test_activations_are_added_and_never_divided():
    m = training_memory(1e9, precision="bf16", world=8, level="full", activations=3e9)
    assert m["activations"] == 3e9 and m["total"] == pytest.approx(2e9 + 3e9)


def test_memory_per_gpu_is_the_same_accounting():
    assert memory_per_gpu(7e9, 4, "adam", 1, "none")["total"] == 112e9
    assert memory_per_gpu(7e9, 2, "adam", 1, "none")["total"] == 112e9  # not 12 B/param: the master copy counts
    assert memory_per_gpu(7e9, 2, "adam", 8, "full") == training_memory(7e9, precision="bf16", world=8, level="full")
    with pytest.raises(ValueError):
        memory_per_gpu(7e9, 1)


def test_llama_7b_weight_state_at_t4_counts_the_master_copy():
    m = per_rank("Llama-2 7B", seq=4096, tp=4)
    assert m["weight state"] / GB == pytest.approx(25.77, abs=0.01)  # 12 h^2 L / 4 params x 16 B
    assert m["total"] == pytest.approx(m["weight state"] + 32 * transformer_layer_bytes(4096, 1, 4096, 32, tp=4))



# Notebook 06 counts no memory (launching and scaling); every other notebook from 00 to 08 does, through
# this module or activation_memory.per_rank, which adds its activations to training_memory (the test above).
ACCOUNTED = ("00_", "01_", "02_", "03_", "04_", "05_", "07_", "08_")
CALLERS = re.compile(r"^from distlab\.lab\.(?:training_memory import .*\b(training_memory|bytes_per_param)"
                     r"|activation_memory import .*\b(per_rank))\b", re.M)


@pytest.mark.parametrize("prefix", ACCOUNTED)
def test_notebooks_00_to_08_count_memory_with_this_function(prefix):
    """Issue 28's "one memory accounting from notebook 00 to 08": each calls it in a code cell."""
    (source,) = COURSE.glob(f"{prefix}*.py")
    code = "\n".join(c.source for c in jupytext.read(source).cells if c.cell_type == "code")
    imported = CALLERS.search(code)
    assert imported, f"{source.name} does not import distlab.lab.training_memory (or activation_memory.per_rank)"
    name = imported.group(1) or imported.group(2)
    assert re.search(rf"\b{name}\(", code), f"{source.name} imports {name} but never calls it"
