"""The MoE lab (distlab.lab.expert_parallel): the router, capacity and the load-balancing loss, DeepSeek's bias
balancing and shared experts, dropless experts by grouped GEMM and by a loop, in one process (no launch).
GShard's padded expert-parallel dispatch against the single-process MoE (forward and gradients, the counts
exchanged, the all-to-alls counted by CollectiveRecorder) rides at 4 ranks in tests/distlab/test_planner.py's
one launch of the labs' rank programs; expert parallelism on a (dp, ep) mesh and the all-to-all against
imbalance share one 4-rank launch here."""
from __future__ import annotations

import pytest
import torch

from distlab import torchrun
from distlab.lab.expert_parallel import (DEEPSEEK_V3, BiasRouter, Routing, SharedExpertMoE, assign, capacity,
                                         dropless_forward, grouped_mm_works, load_balancing_loss, router_training,
                                         seeded_moe, update_bias, with_bias_router)
from distlab.lab.expert_parallel.dropless import KERNELS
from distlab.lab.expert_parallel.imbalance import imbalanced_splits


def _routing(experts: list[int], n_experts: int) -> Routing:
    e = torch.tensor(experts)[:, None]
    return Routing(torch.nn.functional.one_hot(e[:, 0], n_experts).float(), e, torch.ones(len(experts), 1))


def test_capacity_is_gshards_ceiling():
    assert capacity(64, 4, 1, 1.25) == 20 and capacity(10, 4, 2, 1.0) == 5 and capacity(7, 2, 1, 1.0) == 4


def test_the_first_slots_of_each_expert_are_kept_per_group():
    slots = assign(_routing([0, 0, 0, 1, 0, 0, 1, 0], 2), 2, cap=2, groups=2)
    assert slots.position.tolist() == [0, 1, 2, 0, 0, 1, 0, 2]   # the queues restart in the second group
    assert slots.keep.tolist() == [True, True, False, True, True, True, True, False] and slots.dropped == 2


def test_aux_loss_is_one_when_balanced_and_e_when_collapsed():
    assert load_balancing_loss(_routing([0, 1, 2, 3], 4), 4).item() == pytest.approx(1.0)
    assert load_balancing_loss(_routing([2, 2, 2, 2], 4), 4).item() == pytest.approx(4.0)


def test_moe_drops_nothing_at_large_capacity_and_counts_its_drops():
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    roomy, tight = (seeded_moe(0, hidden=8, ffn=16, n_experts=4, top_k=2, capacity_factor=f) for f in (4.0, 0.5))
    out, cut = roomy(x), tight(x)
    assert out.dropped == 0 and out.tokens_per_expert.sum().item() == 64
    assert cut.dropped == 64 - cut.tokens_per_expert.sum().item() > 0
    assert (cut.tokens_per_expert <= capacity(32, 4, 2, 0.5)).all()


# -- DeepSeek's balancing and shared experts (distlab.lab.expert_parallel.balance) ----------------------------
def test_the_bias_chooses_the_experts_and_the_scores_still_weigh_them():
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    plain = seeded_moe(0, hidden=8, ffn=16, n_experts=4, top_k=2).router
    biased = with_bias_router(seeded_moe(0, hidden=8, ffn=16, n_experts=4, top_k=2)).router
    zero, base = biased(x), plain(x)
    assert torch.equal(zero.experts, base.experts) and torch.equal(zero.gates, base.gates)   # a zero bias: the router
    biased.bias[:] = torch.tensor([0.0, 0.0, 0.0, 2.0])   # above any probability: expert 3 is in every top-2
    routed = biased(x)
    assert (routed.experts == 3).any(dim=1).all()
    raw = routed.probs.gather(1, routed.experts)
    assert torch.allclose(routed.gates, raw / raw.sum(dim=1, keepdim=True))   # the scores, not score + bias


def test_the_bias_moves_against_the_load_and_not_at_balance():
    router = BiasRouter(8, 4, top_k=1)
    experts = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3])[:, None]   # loads 3, 2, 2, 1: mean 2
    load = update_bias(router, Routing(torch.ones(8, 4) / 4, experts, torch.ones(8, 1)), gamma=0.1)
    assert load.tolist() == [3, 2, 2, 1] and torch.allclose(router.bias, torch.tensor([-0.1, 0.0, 0.0, 0.1]))


def test_bias_balancing_sends_no_gradient_and_balances_the_choice():
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    runs = {m: router_training(m, x, steps=100) for m in ("none", "switch loss", "bias")}
    assert torch.equal(runs["bias"]["weight"], runs["none"]["weight"]) and runs["bias"]["p0"] == runs["none"]["p0"]
    assert runs["switch loss"]["p0"] < runs["none"]["p0"]   # the loss's gradient works against the task's
    tail = {m: sum(r["imbalance"][-20:]) / 20 for m, r in runs.items()}
    assert tail["bias"] < tail["none"] and tail["switch loss"] < tail["none"]
    assert sum(runs["bias"]["kept"]) > sum(runs["none"]["kept"])   # fewer tokens dropped at capacity
    with pytest.raises(ValueError, match="method must be one of"):
        router_training("z-loss", x)


def test_shared_experts_add_to_every_token():
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    layer = SharedExpertMoE(seeded_moe(0, hidden=8, ffn=16, n_experts=4, top_k=1, capacity_factor=0.5), 2, 16)
    out = layer(x)
    assert out.dropped > 0   # a dropped token still gets the shared experts' output
    assert torch.allclose(out.y, layer.moe(x).y + layer.shared[0](x) + layer.shared[1](x))


def test_deepseek_v3s_experts_hold_most_of_its_parameters_and_few_are_active():
    c = DEEPSEEK_V3
    assert c.expert_parameters() == 3 * 7168 * 2048
    assert c.total_ffn_parameters() == 58 * 257 * c.expert_parameters() < 671e9   # the paper's total
    assert c.active_ffn_parameters() == 58 * 9 * c.expert_parameters() < 37e9     # and its active


# -- dropless (distlab.lab.expert_parallel.dropless) -----------------------------------------------------------
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("kernel", KERNELS)
def test_dropless_is_the_moe_whose_capacity_drops_nothing_forward_and_backward(kernel, top_k):
    x0 = torch.randn(48, 16, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(48, 16, generator=torch.Generator().manual_seed(2))
    ref, moe = (seeded_moe(0, hidden=16, ffn=32, n_experts=4, top_k=top_k, capacity_factor=f) for f in (4.0, 0.5))
    moe = with_bias_router(moe)
    moe.router.bias[3] = -2.0   # expert 3 gets no slot: an empty block
    ref = with_bias_router(ref)
    ref.router.bias[3] = -2.0
    x, xr = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    out, want = dropless_forward(moe, x, kernel=kernel), ref(xr)
    assert out.tokens_per_expert[3] == 0 and out.dropped == want.dropped == 0 and moe(x0).dropped > 0
    assert torch.equal(out.tokens_per_expert, want.tokens_per_expert)
    out.y.backward(grad)
    want.y.backward(grad)
    assert torch.allclose(out.y, want.y, atol=1e-6) and torch.allclose(x.grad, xr.grad, atol=1e-6)
    for (name, p), q in zip(moe.named_parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name


def test_grouped_mm_has_a_cpu_kernel_in_this_torch_and_bad_kernels_are_named():
    assert grouped_mm_works(16, 32)   # what notebook 11 says of torch 2.13's CPU build
    with pytest.raises(ValueError, match="kernel must be one of"):
        dropless_forward(seeded_moe(0, hidden=16, ffn=32, n_experts=4), torch.randn(4, 16), kernel="triton")


# -- the all-to-all against imbalance, EP on a mesh (one 4-rank launch) ----------------------------------------
def test_imbalanced_splits_send_every_token_and_the_hot_share():
    """Every world size to 8, token counts that do and do not divide (and fewer tokens than ranks), rho from
    balanced to every token on the hot rank."""
    for world in range(1, 9):
        for tokens in (1, 3, 7, 64, 1000, 4097):
            for share in (0.0, 0.1, 0.5, 0.9, 1.0):
                rho = 1 + share * (world - 1)
                splits = imbalanced_splits(tokens, world, rho)
                assert len(splits) == world and sum(splits) == tokens and min(splits) >= 0, (world, tokens, rho)
                if world > 1:
                    assert splits[0] == round(rho * tokens / world) and max(splits[1:]) - min(splits[1:]) <= 1


def test_an_imbalance_outside_one_to_w_is_refused():
    with pytest.raises(ValueError, match="between 1"):
        imbalanced_splits(64, 4, 5.0)


@pytest.fixture(scope="module")
def scale_runs():
    small = dict(tokens=64, hidden=8, ffn=16, ratios=(1.0, 2.5, 4.0), calls=1, repeats=1, min_run_time=0.001)
    return torchrun("distlab.lab.expert_parallel.mesh:ep_scale_job", 4, kwargs=dict(imbalance=small),
                    timeout=300).results


@pytest.mark.slow
def test_expert_parallelism_carved_from_data_parallelism_is_one_process(scale_runs):
    """(dp, ep) = (2, 2): tokens exchanged in the ep row, an expert's gradient summed over its dp column, the
    router's over all four; output and input gradient exact, the summed gradients to rounding."""
    for run in (r["mesh"] for r in scale_runs):
        d, e = run["coordinate"]
        assert run["expert"] == e and run["ep_group"] == [2 * d, 2 * d + 1] and run["dp_group"] == [e, 2 + e]
        assert run["y_diff"] == 0 and run["x_grad_diff"] == 0, run
        assert run["expert_grad_diff"] < 1e-5 and run["router_grad_diff"] < 1e-5, run
        assert run["a2a"]["all_to_all"]["calls"] == 4
        grads = 4 * run["expert_parameters"]   # float32; over 2 ranks a ring all-reduce sends 2(n-1)/n = 1 times it
        assert run["expert_reduce"]["all_reduce"] == {"calls": 1, "bytes": grads, "wire_bytes": grads}
        assert run["dense_reduce"]["all_reduce"]["bytes"] == 4 * run["router_parameters"]


@pytest.mark.slow
def test_the_hot_experts_rank_receives_rho_times_the_balanced_rows(scale_runs):
    world = len(scale_runs)
    for i, rho in enumerate((1.0, 2.5, 4.0)):
        rows = [r["imbalance"]["rows"][i] for r in scale_runs]
        for r, row in enumerate(rows):   # what each rank receives is what the others send it
            assert row["recv"] == [other["send"][r] for other in rows]
            assert row["all_to_all"] > 0 and row["expert"] > 0
        assert rows[0]["busiest_rows"] == sum(rows[0]["recv"]) == world * round(rho * 64 / world)
