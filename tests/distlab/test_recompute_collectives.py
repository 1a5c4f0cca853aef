"""Which collectives recomputation re-issues in a tensor-parallel layer (notebook 08's "Explore"):
counted with distlab.measure.comm.CollectiveRecorder on torchtitan's plan and selective policy, in one
process on PyTorch's fake process group (world 2: the collectives are dispatched, nothing is sent)."""
from collections import Counter, defaultdict
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts,
                                    set_checkpoint_early_stop)

from distlab.lab.activation_memory import tp_collectives_per_layer
from distlab.measure.comm import CollectiveRecorder

H, WORLD = 16, 2
# torchtitan's _op_sac_save_list (models/llama3/infra/parallelize.py), the ops that matter here
SAVE = {torch.ops.aten.mm.default, torch.ops._c10d_functional.reduce_scatter_tensor.default}


class FeedForward(nn.Module):  # torchtitan's: SwiGLU, bias-free linears (so they dispatch aten.mm)
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(H, 2 * H, bias=False), nn.Linear(H, 2 * H, bias=False)
        self.w2 = nn.Linear(2 * H, H, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    """Two Megatron halves (norm, column- then row-parallel linears), the second standing in for attention."""

    def __init__(self):
        super().__init__()
        self.norm1, self.half1, self.norm2, self.half2 = nn.LayerNorm(H), FeedForward(), nn.LayerNorm(H), FeedForward()

    def forward(self, x):
        h = x + self.half1(self.norm1(x))
        return h + self.half2(self.norm2(h))


def plan(sp: bool) -> dict:
    out = {}
    for half, norm in (("half1", "norm1"), ("half2", "norm2")):
        out |= {f"{half}.w1": ColwiseParallel(), f"{half}.w3": ColwiseParallel(),
                f"{half}.w2": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()}
        if sp:
            out |= {norm: SequenceParallel(),
                    half: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))}
    return out


def torchtitan_policy():
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):  # saves the reduce-scatters and every mm but the second
        if func == torch.ops.aten.mm.default:
            meta["mm"] += 1
        save = func in SAVE and not (func == torch.ops.aten.mm.default and meta["mm"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield init_device_mesh("cpu", (WORLD,))
    finally:
        dist.destroy_process_group()


def step_counts(mesh, sp: bool, recompute: str) -> Counter:
    torch.manual_seed(0)
    layer = parallelize_module(Layer(), mesh, plan(sp))
    x = torch.randn(2, 8 // WORLD if sp else 8, H, requires_grad=True)  # a rank's sequence shard under SP
    fn = {"none": layer, "full": partial(checkpoint, layer, use_reentrant=False),
          "selective": partial(checkpoint, layer, use_reentrant=False, context_fn=torchtitan_policy)}[recompute]
    with CollectiveRecorder(WORLD) as rec, set_checkpoint_early_stop(recompute != "full"):  # full: Megatron's rerun
        fn(x).sum().backward()
    return Counter(rec.counts())


@pytest.mark.parametrize("sp", [True, False], ids=["sequence parallel", "tensor parallel"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_reissues_what_the_calculator_counts(mesh, sp, recompute):
    extra = step_counts(mesh, sp, recompute) - step_counts(mesh, sp, "none")
    model = Counter(tp_collectives_per_layer(WORLD, sp, recompute)) - Counter(tp_collectives_per_layer(WORLD, sp))
    assert extra == model
    if recompute == "selective":  # torchtitan saves the reduce-scatters, not the all-gathers
        assert extra == (Counter({"all-gather": 2}) if sp else Counter({"all-reduce": 1}))
