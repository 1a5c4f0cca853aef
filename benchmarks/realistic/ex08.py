"""Exercise 8 (a Megatron tensor-parallel MLP by hand): mistakes people make with f, g and the split layers."""
from __future__ import annotations

from . import Mistake

_F_FORWARD = "    def forward(ctx, x: torch.Tensor) -> torch.Tensor:\n        ### BEGIN SOLUTION\n        return x\n"
_F_BACKWARD_REDUCE = """        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad)  # op=ReduceOp.SUM, the default
        return grad
"""
_G_REDUCE = ("        dist.all_reduce(out)  # op=ReduceOp.SUM: each partial sum is a part of the output, "
             "not an estimate of it\n")
_G_BACKWARD = "    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:\n        ### BEGIN SOLUTION\n        return grad\n"
_ROW_FORWARD = "        return ReduceFromParallelRegion.apply(F.linear(x, self.weight)) + self.bias\n"
_COL_WEIGHT = "        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=0)[rank].clone())\n"
_COL_BIAS = "        self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, dim=0)[rank].clone())\n"
_ROW_WEIGHT = "        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=1)[rank].clone())\n"
_ROW_BIAS = "        self.bias = nn.Parameter(linear.bias.detach().clone())\n"
_COL_FORWARD = "        return F.linear(CopyToParallelRegion.apply(x), self.weight, self.bias)\n"

MISTAKES = [
    Mistake(
        name="f_reduces_in_forward",
        what="f is written the wrong way round: it all-reduces in the forward (summing W copies of the "
             "input) and passes the gradient through unreduced in the backward.",
        source="Megatron-LM (Shoeybi et al. 2019) sec. 3: f and g are conjugate; swapping which direction "
               "communicates is the classic confusion (course/08_tensor_parallel.py: 'why the forward of f "
               "must not communicate')",
        edits={_F_FORWARD: """    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x)
        return x
""",
               _F_BACKWARD_REDUCE: "        return grad\n"},
        key_terms=("forward",),
    ),
    Mistake(
        name="f_backward_not_reduced",
        what="f's backward returns the gradient unchanged, so the input's gradient is only this rank's "
             "shard's contribution, different on every rank.",
        source="course/08_tensor_parallel.py warns: 'a missing all-reduce in the backward raises no error "
               "(the layers before the block get a wrong gradient, a different one on each rank)'",
        edits={_F_BACKWARD_REDUCE: "        return grad  # f is the identity\n"},
        key_terms=("backward",),
    ),
    Mistake(
        name="g_via_torch_distributed_nn_all_reduce",
        what="g is torch.distributed.nn.functional.all_reduce, whose backward all-reduces the gradient "
             "again, so every gradient below the row layer is W times too large (and the backward makes "
             "an extra all-reduce).",
        source="https://github.com/Dao-AILab/flash-attention/issues/1244 (torch.distributed.nn's all_reduce "
               "backward all-reduces; Megatron's g must be the identity in the backward)",
        edits={"import torch.distributed as dist\n":
               "import torch.distributed as dist\nimport torch.distributed.nn.functional as dist_nn\n",
               _ROW_FORWARD: "        return dist_nn.all_reduce(F.linear(x, self.weight)) + self.bias\n"},
        key_terms=("backward",),
    ),
    Mistake(
        name="g_averages",
        what="g averages the partial sums (all-reduce, then / world_size) instead of adding them: the "
             "output is 1/W of linear's.",
        source="https://github.com/huggingface/text-generation-inference/issues/1036 (ReduceOp.AVG habits "
               "around RowParallelLinear); DDP's averaging carried over to tensor parallelism",
        edits={_G_REDUCE: "        dist.all_reduce(out)\n        out /= dist.get_world_size()  # the mean of the ranks' results\n"},
        key_terms=("sum",),
    ),
    Mistake(
        name="f_backward_averages",
        what="f's backward averages the input gradient over the ranks (all-reduce, then / world_size) "
             "instead of summing it: the input's gradient is 1/W of the unsplit block's.",
        source="https://github.com/facebookresearch/fairseq/issues/494 (DDP averages gradients over workers, "
               "and code written after it divides by the world size by reflex)",
        edits={"        dist.all_reduce(grad)  # op=ReduceOp.SUM, the default\n":
               "        dist.all_reduce(grad)\n        grad /= dist.get_world_size()  # average, as DDP does\n"},
        key_terms=("sum",),
    ),
    Mistake(
        name="row_bias_on_every_rank",
        what="The row-parallel layer adds its bias inside F.linear before g, on every rank, so the "
             "all-reduce adds the bias W times.",
        source="https://github.com/Wenyueh/MinivLLM/issues/80 (RowParallelLinear adds bias multiple times "
               "when tp_size > 1); course/08_tensor_parallel.py: 'every rank adding it before would add it t times'",
        edits={_ROW_FORWARD: "        return ReduceFromParallelRegion.apply(F.linear(x, self.weight, self.bias))\n"},
        key_terms=("bias",),
    ),
    Mistake(
        name="row_bias_split_over_ranks",
        what="Every rank adds bias / world_size before g, so the output has the bias once, but the bias's "
             "gradient is 1/W of the unsplit layer's.",
        source="https://github.com/awslabs/slapo/issues/10 (fix proposed there: 'average the bias across "
               "different devices'); https://github.com/PaddlePaddle/FastDeploy/pull/5247 divides it by tp_size",
        edits={_ROW_FORWARD: "        return ReduceFromParallelRegion.apply(F.linear(x, self.weight, self.bias / dist.get_world_size()))\n"},
        key_terms=("bias",),
    ),
    Mistake(
        name="row_bias_on_rank0_only",
        what="Only rank 0 adds the row layer's bias before g: the output has it once, but the bias gets no "
             "gradient on the other ranks (its .grad stays None there).",
        source="https://github.com/GeeeekExplorer/nano-vllm/issues/99 (bias added on tp_rank 0 before the "
               "all-reduce); https://github.com/awslabs/slapo/issues/10 ('only one device holds the bias')",
        edits={_ROW_BIAS: _ROW_BIAS + "        self.rank = rank\n",
               _ROW_FORWARD: "        bias = self.bias if self.rank == 0 else None  # the bias once in the sum\n"
                             "        return ReduceFromParallelRegion.apply(F.linear(x, self.weight, bias))\n"},
        key_terms=("bias",),
    ),
    Mistake(
        name="column_weight_is_a_view",
        what="The column layer's weight is chunk(...)[rank] without clone(): a view that keeps the whole "
             "unsplit weight alive (and writes into it).",
        source="https://round-lake.dustinice.workers.dev:443/https/blog.csdn.net/Fluid_ray/article/details/110873095 (split/chunk return views "
               "sharing the original tensor's memory: clone to get your own)",
        edits={_COL_WEIGHT: "        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=0)[rank])\n"},
        key_terms=("storage",),
    ),
]

LEGAL = [
    Mistake(
        name="explicit_slices_under_no_grad",
        what="The shards are cut with explicit index ranges rank*k:(rank+1)*k under torch.no_grad() and "
             "copied with clone(), instead of chunk(...)[rank].",
        source="course/08_tensor_parallel.py's by-hand cell slices fc1.weight[r * c:(r + 1) * c] the same way",
        edits={_COL_WEIGHT + _COL_BIAS: """        k = linear.out_features // world_size
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight[rank * k:(rank + 1) * k].clone())
            self.bias = nn.Parameter(linear.bias[rank * k:(rank + 1) * k].clone())
""",
               _ROW_WEIGHT + _ROW_BIAS: """        k = linear.in_features // world_size
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight[:, rank * k:(rank + 1) * k].clone())
            self.bias = nn.Parameter(linear.bias.clone())
"""},
    ),
    Mistake(
        name="matmul_instead_of_linear",
        what="Both layers multiply by the transposed weight with @ and add the bias by hand instead of "
             "calling F.linear; the bias still goes in after g.",
        source="Megatron-LM (Shoeybi et al. 2019) writes the layers as XA and (.)B: learners transcribe the matmuls",
        edits={_COL_FORWARD: "        return CopyToParallelRegion.apply(x) @ self.weight.t() + self.bias\n",
               _ROW_FORWARD: "        partial = x @ self.weight.t()\n"
                             "        return ReduceFromParallelRegion.apply(partial) + self.bias\n"},
    ),
    Mistake(
        name="async_all_reduce_then_wait",
        what="f's backward and g's forward call all_reduce with async_op=True and wait on the returned work "
             "before returning.",
        source="https://docs.pytorch.org/docs/stable/distributed.html (async_op=True returns a Work handle; "
               "wait() before using the tensor)",
        edits={"        dist.all_reduce(grad)  # op=ReduceOp.SUM, the default\n":
               "        dist.all_reduce(grad, async_op=True).wait()\n",
               _G_REDUCE: "        work = dist.all_reduce(out, async_op=True)\n        work.wait()\n"},
    ),
]
