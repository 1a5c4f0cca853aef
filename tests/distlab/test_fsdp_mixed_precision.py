"""FSDP2's MixedPrecisionPolicy and clipping sharded or staged gradients (distlab.lab.fsdp_mixed_precision), in
one 2-rank launch of the lab's own rank program, as notebook 04 runs it: what each rank holds in which dtype, the
collectives' bytes, and every norm against one process's."""
import pytest

from distlab import torchrun

FP32, BF16_FP32, BF16_BF16 = "fp32", "bf16 params, fp32 reduce", "bf16 params, bf16 reduce"


@pytest.fixture(scope="module")
def runs():
    return torchrun("distlab.lab.fsdp_mixed_precision:mixed_precision_rank", 2, timeout=300).results


def test_the_shard_stays_the_fp32_master_and_the_unsharded_copy_is_bf16_only_in_the_forward(runs):
    for run in runs:
        p = run["policies"]
        assert p[FP32]["in_forward"] == "Parameter float32"
        assert p[BF16_FP32]["in_forward"] == p[BF16_BF16]["in_forward"] == "Parameter bfloat16"
        assert {q["after_forward"] for q in p.values()} == {"DTensor float32"}  # resharded to the fp32 shard
        assert {q["grad"] for q in p.values()} == {"DTensor float32"}  # cast back to the shard's dtype


def test_param_dtype_halves_the_gathers_and_reduce_dtype_the_reduce_scatters(runs):
    p = runs[0]["policies"]
    assert p[BF16_FP32]["all_gather_bytes"] * 2 == p[FP32]["all_gather_bytes"] == p[BF16_BF16]["all_gather_bytes"] * 2
    assert p[BF16_FP32]["reduce_scatter_bytes"] == p[FP32]["reduce_scatter_bytes"]
    assert p[BF16_BF16]["reduce_scatter_bytes"] * 2 == p[FP32]["reduce_scatter_bytes"]


def test_clip_grad_norm_on_dtensors_is_one_processs_norm_and_stages_must_add_their_squares(runs):
    ref = runs[0]["reference_norm"]
    for run in runs:
        assert run["reference_norm"] == ref
        assert run["policies"][FP32]["norm"] == pytest.approx(ref, rel=1e-5)  # parity: the same global batch
        for name in (BF16_FP32, BF16_BF16):  # bf16's rounding moves it, a little
            norm = run["policies"][name]["norm"]
            assert norm != ref and norm == pytest.approx(ref, rel=1e-2)
        assert run["stages"]["combined_norm"] == pytest.approx(ref, rel=1e-6) and run["stages"]["stage_norm"] < ref
    assert sum(r["stages"]["stage_norm"] ** 2 for r in runs) == pytest.approx(ref ** 2, rel=1e-6)
