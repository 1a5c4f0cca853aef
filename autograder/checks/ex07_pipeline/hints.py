"""Exercise 7's hints, three tiers per criterion (``check(7, hint=k)``; :mod:`autograder.commands.check`).

1: why it matters, 2: the mechanism, 3: the API to use. Plain data, read on its own
(:func:`autograder.grader.registry.hints`): no imports. The schedule is GPipe's (Huang et al., 2019): all
micro-batches forward, then all backward.
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "every_microbatch_once": (
        "A pipeline streams the batch in equal pieces: each stage works on one piece at a time, every piece "
        "once forward and once backward.",
        "Cut the batch into exactly n_microbatches equal pieces along the first dimension, call the stage "
        "once per piece, and backpropagate each piece's output once.",
        "x.chunk(n_microbatches) (not split(n), which makes pieces of n rows) on rank 0, y.chunk(...) on "
        "rank 1, and one backward per micro-batch.",
    ),
    "loss_matches": (
        "The loss a pipeline reports is the loss of the whole batch, the same number the unsplit model "
        "gives.",
        "Each micro-batch's mean loss, divided by the number of micro-batches, adds up over the "
        "micro-batches to the batch's mean loss; return that sum, not the last micro-batch's.",
        "On rank 1, cross_entropy(stage(act), y_i) / n_microbatches per micro-batch, then "
        "torch.stack(...).sum().detach() as the return value; None on rank 0.",
    ),
    "stage0_grads_match": (
        "Stage 0's parameters only get a gradient if the backward is continued across the process boundary, "
        "from what stage 1 computed.",
        "Stage 1 sends back the gradient of each activation it received; stage 0 receives it and runs the "
        "backward of that micro-batch's output with it, in micro-batch order.",
        "On rank 0, torch.empty_like(out) as the buffer for dist.recv(src=1), then out.backward(buffer); "
        "on rank 1 the received activation must require grad (requires_grad_()) so its .grad exists.",
    ),
    "stage1_grads_match": (
        "Gradients accumulate over micro-batches: their sum must be the gradient of the whole batch's mean loss, or "
        "the pipeline trains with a step size that depends on how the batch was split.",
        "Backpropagate each micro-batch's loss once, scaled by one over the number of micro-batches, so the "
        "accumulated .grad equals the unsplit model's.",
        "Divide each micro-batch's cross_entropy by n_microbatches before calling backward on it; never "
        "zero the gradients between micro-batches.",
    ),
    "stages_overlap": (
        "The point of a pipeline is that the stages work at the same time: stage 1 should start on the "
        "first micro-batch while stage 0 computes the next.",
        "Send each micro-batch's activations as soon as they are computed, inside the forward loop, not "
        "all of them after it.",
        "Put rank 0's dist.send (of the output detached and contiguous, dst=1) inside the forward loop, "
        "right after the stage call; rank 1 calls dist.recv(..., src=0) once per micro-batch.",
    ),
    "ofob_matches": (
        "A schedule changes when each micro-batch runs, never what it computes: 1F1B must give the same loss and "
        "gradients as GPipe and as the unsplit model.",
        "Every micro-batch still goes forward once and backward once, with its loss divided by the number of "
        "micro-batches; only the interleaving differs. Two neighbours now send to each other in the same steady "
        "state, so a send must not wait for the peer's receive.",
        "dist.isend returns a Work to wait on before returning; dist.recv can stay blocking.",
    ),
    "ofob_order": (
        "The point of 1F1B is memory: a micro-batch's backward frees its activations, so starting backwards early "
        "caps how many micro-batches a stage keeps alive.",
        "Stage s runs min(p - 1 - s, m) forwards first, then one forward and one backward in turn (forward of the "
        "next micro-batch, backward of the oldest), then the backwards left; each result goes to the neighbour as "
        "soon as it exists.",
        "Write the order out for p = 2, m = 4 on paper first; distlab.lab.pipeline.timeline draws it "
        "(notebook 07's widget).",
    ),
    "ofob_memory": (
        "GPipe keeps all m micro-batches' activations on the first stage; 1F1B keeps at most p - s, which is what "
        "lets m grow (a smaller bubble) without the memory growing with it.",
        "A micro-batch's saved tensors are freed when its backward has run and nothing else references its graph; "
        "the schedule decides how many are alive at once.",
        "Drop your references to a micro-batch's input and output after its backward (pop them from where you "
        "kept them).",
    ),
}
