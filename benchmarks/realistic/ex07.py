"""Exercise 7 (a GPipe schedule by hand): mistakes people make with send/recv and micro-batches."""
from __future__ import annotations

from . import Mistake

_RANK0_FORWARD = """        for x_i in x.chunk(m):
            out = stage(x_i)
            dist.send(out.detach().contiguous(), dst=1)  # stage 1 can start on it now
            outputs.append(out)
"""
_BUFFER = "        act = torch.empty(y_i.shape[0], hidden, dtype=x.dtype, device=x.device)\n"
_LOSS = "        loss = nn.functional.cross_entropy(stage(act), y_i) / m\n"
_RETURN = "    return torch.stack(losses).sum().detach()\n"
_RANK1_BACKWARD = "    for act, loss in zip(inputs, losses):\n"

MISTAKES = [
    Mistake(
        name="forwards_then_sends",
        what="Stage 0 runs every micro-batch's forward first and only then sends the activations, so stage 1 "
             "idles until stage 0 is done: no pipelining at all.",
        source="GPipe (Huang et al. 2019) fig. 2 and course/07_pipeline.py: 'send each micro-batch's activations "
               "as soon as they exist'; the natural first draft collects outputs, then sends them",
        edits={_RANK0_FORWARD: """        for x_i in x.chunk(m):
            outputs.append(stage(x_i))
        for out in outputs:  # every forward is done: now hand the activations over
            dist.send(out.detach().contiguous(), dst=1)
"""},
        key_terms=("pipelining",),
    ),
    Mistake(
        name="loss_not_scaled",
        what="Each micro-batch's loss is backpropagated unscaled (no / n_microbatches) and only the returned "
             "loss is averaged, so every gradient is n_microbatches times the unsplit model's.",
        source="https://github.com/deepspeedai/DeepSpeed/issues/7773 (gradients summed instead of averaged over "
               "micro-batches with pipeline parallelism)",
        edits={_LOSS: "        loss = nn.functional.cross_entropy(stage(act), y_i)\n",
               _RETURN: "    return torch.stack(losses).mean().detach()\n"},
        key_terms=("n_microbatches",),
    ),
    Mistake(
        name="grad_scaled_again_on_stage0",
        what="Stage 0 divides the received gradient by n_microbatches once more, although stage 1's loss is "
             "already scaled: stage 0's gradients are 1/n_microbatches of the right ones.",
        source="https://github.com/areal-project/AReaL/pull/1273 (the pipeline schedule's /num_microbatches "
               "applied on top of a loss that was already normalised)",
        edits={"            out.backward(grad)\n": "            out.backward(grad / m)  # average over the micro-batches\n"},
        key_terms=("stage 0",),
    ),
    Mistake(
        name="returns_mean_of_scaled_losses",
        what="Rank 1 returns the mean of the micro-batch losses that were already divided by n_microbatches, "
             "so the reported loss is n_microbatches times too small (the gradients are right).",
        source="course/07_pipeline.py: 'why the loss is divided by m'; averaging the list of scaled losses "
               "is the usual gradient-accumulation logging slip",
        edits={_RETURN: "    return torch.stack(losses).mean().detach()\n"},
        key_terms=("loss",),
    ),
    Mistake(
        name="recv_buffer_default_dtype",
        what="Stage 1's receive buffer is made with torch.empty's default dtype (float32), not x's dtype, so "
             "a float64 (or bf16) pipeline receives bytes of the wrong width.",
        source="exercises/ex07_pipeline.py contract: the activation has the 'dtype of x'; torch.empty without "
               "dtype= gives float32, the usual slip when the recv buffer is pre-allocated by hand",
        edits={_BUFFER: "        act = torch.empty(y_i.shape[0], hidden, device=x.device)\n"},
        key_terms=("dtype",),
    ),
    Mistake(
        name="recv_buffer_shaped_like_input",
        what="Stage 1 receives into a buffer shaped like the input micro-batch (B/m x in_features) instead "
             "of the activation (B/m x hidden).",
        source="https://app.semanticdiff.com/gh/microsoft/DeepSpeed/commit/1ab1928d7948c45e95fc000d6bb346b5bdafc391 "
               "(pipeline recv buffers allocated with a stale shape give a tensor shape mismatch)",
        edits={_BUFFER: "        act = torch.empty_like(x.chunk(m)[0])  # one micro-batch\n"},
        key_terms=("shape",),
    ),
    Mistake(
        name="split_instead_of_chunk",
        what="The batch is cut with torch.split(m), which makes chunks of m rows (B/m micro-batches), "
             "instead of torch.chunk(m), which makes m micro-batches; the losses are still divided by m.",
        source="https://www.youtip.online/post/pytorch-torch-split.html (split's int argument is the size of "
               "each chunk, chunk's the number of chunks)",
        edits={"        for x_i in x.chunk(m):\n": "        for x_i in x.split(m):\n",
               "    for y_i in y.chunk(m):\n": "    for y_i in y.split(m):\n"},
        key_terms=("micro-batch",),
    ),
    Mistake(
        name="backward_order_mismatch",
        what="Stage 1 runs its backwards last micro-batch first while stage 0 applies the received gradients "
             "first to last, so each of stage 0's outputs gets another micro-batch's gradient.",
        source="GPipe (Huang et al. 2019) fig. 2 draws the backward passes in reverse micro-batch order; "
               "copying it on one stage only pairs the wrong gradients",
        edits={_RANK1_BACKWARD: "    for act, loss in zip(reversed(inputs), reversed(losses)):  # last in, first out\n"},
        key_terms=("gradient",),
    ),
    Mistake(
        name="received_activation_not_requires_grad",
        what="Stage 1 never marks the received buffer as requiring grad, so buffer.grad is None and no "
             "gradient can be sent back to stage 0.",
        source="course/07_pipeline.py: 'receive them on stage 1 into a buffer that requires grad'; a tensor "
               "filled by dist.recv is a leaf with requires_grad=False",
        edits={"        act.requires_grad_()\n": ""},
        key_terms=("require",),
    ),
]


_CONTRACT = "written blind to the checks from one_f_one_b_step's contract (Narayanan et al. 2021's PipeDream-Flush)"
_ONE_F_ONE_B = [
    Mistake("1f1b_gpipe_order", "Every forward first, then every backward (GPipe's order) in one_f_one_b_step.",
            _CONTRACT, {"    warm = min(p - 1 - rank, m)": "    warm = m"}, ("GPipe",)),
    Mistake("1f1b_warmup_p_minus_s", "p - s warm-up forwards instead of p - 1 - s.", _CONTRACT,
            {"    warm = min(p - 1 - rank, m)": "    warm = min(p - rank, m)"}, ("order",)),
    Mistake("1f1b_no_warmup", "No warm-up forward: forward and backward alternate from the start.", _CONTRACT,
            {"    warm = min(p - 1 - rank, m)": "    warm = 0"}, ("order",)),
    Mistake("1f1b_blocking_sends", "dist.send (blocking) for both neighbours' sends.", _CONTRACT,
            {"sends.append(dist.isend(out.detach().contiguous(), dst=rank + 1))":
             "dist.send(out.detach().contiguous(), dst=rank + 1)",
             "sends.append(dist.isend(inp.grad.contiguous(), dst=rank - 1))":
             "dist.send(inp.grad.contiguous(), dst=rank - 1)"}, ("isend",)),
    Mistake("1f1b_loss_not_divided", "Each micro-batch's loss is not divided by m in one_f_one_b_step.", _CONTRACT,
            {"            out = nn.functional.cross_entropy(out, ys[i]) / m":
             "            out = nn.functional.cross_entropy(out, ys[i])"}, ("divide",)),
    Mistake("1f1b_sends_not_waited", "The isends' Works are never waited on.", _CONTRACT,
            {"    for work in sends:\n        work.wait()\n": ""}, ("waited",)),
    Mistake("1f1b_loss_on_every_stage", "A loss tensor is returned on stage 0 too.", _CONTRACT,
            {"    return sum(losses) if last else None": "    return sum(losses) if last else torch.zeros(())"},
            ("None",)),
    Mistake("1f1b_retain_graph", "backward(retain_graph=True) keeps every micro-batch's activations alive.", _CONTRACT,
            {"            out.backward()\n": "            out.backward(retain_graph=True)\n",
             "            out.backward(gradient=grad)": "            out.backward(gradient=grad, retain_graph=True)"},
            ("retain_graph",)),
]
MISTAKES += _ONE_F_ONE_B
LEGAL = [
    Mistake(
        name="both_stages_backward_in_reverse",
        what="Both stages run the backwards last micro-batch first (the order GPipe's figure draws); the "
             "gradients still pair up, and their sum does not depend on the order.",
        source="GPipe (Huang et al. 2019) fig. 2; the contract says the backward order is not checked",
        edits={"        for out in outputs:\n            grad = torch.empty_like(out)\n":
               "        for out in reversed(outputs):\n            grad = torch.empty_like(out)\n",
               _RANK1_BACKWARD: "    for act, loss in zip(reversed(inputs), reversed(losses)):\n"},
    ),
    Mistake(
        name="isend_irecv_with_waits",
        what="Non-blocking isend/irecv: stage 0 posts each activation's send right after its forward and "
             "waits for all of them after the loop; stage 1 waits on each irecv before using the buffer.",
        source="https://runebook.dev/en/articles/pytorch/distributed/torch.distributed.send (isend/irecv "
               "return a Work to wait on)",
        edits={_RANK0_FORWARD: """        sends = []
        for x_i in x.chunk(m):
            out = stage(x_i)
            sent = out.detach().contiguous()
            sends.append((sent, dist.isend(sent, dst=1)))  # keep the buffer alive until the send is done
            outputs.append(out)
        for _, work in sends:
            work.wait()
""",
               "        dist.recv(act, src=0)\n": "        dist.irecv(act, src=0).wait()\n"},
    ),
    Mistake(
        name="sum_reduction_over_batch",
        what="Each micro-batch's loss is the summed cross-entropy divided by the whole batch size B, which "
             "equals mean / n_microbatches for equal micro-batches.",
        source="the usual gradient-accumulation idiom: reduction='sum' divided by the global batch size",
        edits={_LOSS: "        loss = nn.functional.cross_entropy(stage(act), y_i, reduction=\"sum\") / y.shape[0]\n"},
    ),
    Mistake("1f1b_schedule_written_out", "1F1B's schedule written out first as a list, then walked.", _CONTRACT,
            {"""    warm = min(p - 1 - rank, m)
    for i in range(warm):
        forward(i)
    for i in range(m):
        if warm + i < m:
            forward(warm + i)
        backward(i)
""": """    warm = min(p - 1 - rank, m)
    plan = [("F", i) for i in range(warm)]
    for i in range(m):
        plan += ([("F", warm + i)] if warm + i < m else []) + [("B", i)]
    for kind, i in plan:
        (forward if kind == "F" else backward)(i)
"""}),
]
