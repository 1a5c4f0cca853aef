"""Exercise 5's hints, three tiers per criterion (``check(5, hint=k)``; :mod:`autograder.commands.check`).

1: why it matters, 2: the mechanism, 3: the API to use. Plain data, read on its own
(:func:`autograder.grader.registry.hints`): no imports. The checkpoint is PyTorch's Distributed Checkpoint
(DCP, ``torch.distributed.checkpoint``) with staging and an atomic commit, as torchtitan's checkpointer does.
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "keeps_last_k": (
        "Checkpoints are large; a long run keeps only the newest few, and deleting must never touch the one "
        "a restart would load.",
        "After a checkpoint is committed, one rank removes the committed checkpoints older than the newest "
        "keep of them; every rank waits until that is done.",
        "distlab.checkpoint.prune(root, keep) on rank 0 after commit(root, step), between two "
        "dist.barrier() calls.",
    ),
    "matches_reference": (
        "Before resuming can be exact, the uninterrupted run must follow the contract exactly: seeding, "
        "data order and the order of the step's calls are all part of it.",
        "Each rank seeds its own generator with the seed plus its rank after building the model; the "
        "sampler is shuffled with the seed and set to each epoch; the scheduler steps after the optimizer.",
        "torch.manual_seed with the seed plus dist.get_rank(); a DistributedSampler with shuffle=True, "
        "seed=seed and drop_last=True, and its set_epoch(epoch); scheduler.step() after optimizer.step().",
    ),
    "fresh_job_resumes": (
        "A resumed run must start the next step from exactly the state the stopped run would have used: "
        "list everything that step reads.",
        "The weights, Adam's moments and step count, the scheduler's position, the step counter, the "
        "position in the data (epoch and batch) and each rank's RNG state must all be saved and restored.",
        "get_state_dict(model, optimizer) into dcp.save/dcp.load, set_state_dict afterwards, "
        "scheduler.state_dict()/load_state_dict, and per rank torch.get_rng_state()/torch.set_rng_state "
        "in its own file (rng-rank{R}.pt).",
    ),
    "interrupted_write_never_loaded": (
        "A process can be killed in the middle of writing a checkpoint; the next attempt must not mistake "
        "the half-written one for a good one.",
        "Write every rank's part into a staging directory, wait for all ranks to finish, then make it "
        "visible with one atomic rename; on load, consider only committed checkpoints.",
        "distlab.checkpoint.staging_path(root, step) as dcp.save's checkpoint_id, dist.barrier(), "
        "commit(root, step) on rank 0; latest_complete(root) when loading.",
    ),
    "restart_resumes": (
        "With torchrun's --max-restarts the whole job starts again after a crash, and a long run on many machines "
        "will crash: a restart that does not continue from the newest complete checkpoint costs the whole run so "
        "far.",
        "At start-up, after building and seeding, load the newest complete checkpoint if one exists and "
        "continue from the step and data position it records; a rank that saved nothing must not differ.",
        "load_checkpoint(root, model, optimizer, scheduler) right after torch.manual_seed, using its "
        "(step, data_position) to set the step counter and the sampler's epoch and offset.",
    ),
    "two_crashes": (
        "Resuming twice must be as exact as resuming once: a run of weeks crashes many times, and a small drift at "
        "each resume adds up to a different model.",
        "Whatever the first resume restored, the second must too; a state restored only partly (the RNG, "
        "the data offset) shows up as a difference after the second crash.",
        "Save and load the same dictionary keys every time (model, optim, scheduler, step, data) plus each "
        "rank's RNG file, and restore the RNG only after seeding.",
    ),
    "reshards": (
        "A sharded checkpoint can be loaded by a different number of ranks, if it is loaded into the new "
        "model's own sharded state rather than into plain tensors.",
        "Build the destination state from the new model and optimizer (their sharded, DTensor state), let "
        "DCP fill it in place, then hand it back to the model and optimizer.",
        "get_state_dict(model, optimizer) for the destination, dcp.load of that state with the checkpoint's "
        "path as checkpoint_id, then set_state_dict(model, optimizer, model_state_dict=..., optim_state_dict=...).",
    ),
    "stream_continues": (
        "A job resumed with more ranks must see the rest of the same data, in the same order: the position "
        "you save has to mean the same place in the data whatever the number of ranks that reads it.",
        "A rank's batch is its share of a step; with W ranks a step uses W x BATCH_SIZE samples of the epoch's "
        "shuffled order, rank r taking every W-th from r on. Count what all the ranks together used, and work "
        "out from it where this rank's share starts at the new W.",
        "dist.get_world_size() when you save and when you resume; the list of a DistributedSampler's indices "
        "for an epoch is this rank's share; slice it from the samples used // the world size.",
    ),
}
