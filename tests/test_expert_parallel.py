"""The MoE lab (distlab.lab.expert_parallel): the router, capacity and the load-balancing loss in one
process (no launch), and GShard's padded expert-parallel dispatch against the single-process MoE in one
2-rank launch: forward and gradients, the counts exchanged, the all-to-alls counted by CollectiveRecorder."""
from __future__ import annotations

import pytest
import torch

from distlab.lab.expert_parallel import Routing, assign, capacity, load_balancing_loss, run_ep_job, seeded_moe


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


def test_padded_expert_parallel_matches_the_single_process_moe():
    ranks = run_ep_job(2, timeout=90, tokens=64)
    for r in ranks:
        assert r["y_diff"] == 0 and r["x_grad_diff"] == 0            # the same adds, in the same order
        assert r["expert_grad_diff"] < 1e-5 and r["router_grad_diff"] < 1e-5   # summed in another order
        assert r["a2a_counts"] == {"all-to-all": 4}               # dispatch and combine, forward and backward
        # Equal splits: every rank sends W * C rows of `hidden` float32 four times, whatever it routed.
        assert r["a2a"]["all_to_all"]["bytes"] == 4 * 2 * r["capacity"] * 16 * 4
        assert r["count_exchange"]["all_to_all"]["calls"] == 1
    assert [r["recv_counts"][0] for r in ranks] == [ranks[0]["send_counts"][r] for r in range(2)]
    assert [r["recv_counts"][1] for r in ranks] == [ranks[1]["send_counts"][r] for r in range(2)]
