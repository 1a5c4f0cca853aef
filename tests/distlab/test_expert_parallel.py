"""The MoE lab (distlab.lab.expert_parallel): the router, capacity and the load-balancing loss in one
process (no launch). GShard's padded expert-parallel dispatch against the single-process MoE (forward and
gradients, the counts exchanged, the all-to-alls counted by CollectiveRecorder) rides at 4 ranks in
tests/distlab/test_planner.py's one launch of the labs' rank programs."""
from __future__ import annotations

import pytest
import torch

from distlab.lab.expert_parallel import Routing, assign, capacity, load_balancing_loss, seeded_moe


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
