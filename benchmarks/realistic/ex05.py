"""Realistic mistakes for exercise 5 (crash-proof DCP checkpoints and exact resume), and legal other styles."""
from __future__ import annotations

from benchmarks.realistic import Mistake

_RNG_SAVE = '    torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")\n'

_COMMIT = "        commit(root, step)  # atomic rename: a crash before this leaves only a .tmp- directory\n"

_SAVE_STATE = """\
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict(),
             "step": step, "data": dict(data_position)}
"""

_LOAD_STATE = """\
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict(),
             "step": 0, "data": {"epoch": 0, "samples": 0}}
"""

_SET = '    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])\n'

MISTAKES: list[Mistake] = [
    Mistake(
        name="rng_state_not_saved",
        what="No rank saves its RNG state, so after a resume dropout draws from the freshly seeded generator.",
        source="https://github.com/vllm-project/speculators/issues/1027 (resume restores optimizer and data but "
               "not the torch RNG: dropout diverges)",
        edits={_RNG_SAVE: ""},
        key_terms=("RNG",),
    ),
    Mistake(
        name="rank0_rng_restored_on_every_rank",
        what="Only rank 0 saves its RNG state (rng.pt) and every rank restores it, so all ranks resume on rank 0's "
             "random stream.",
        source="https://github.com/radixark/miles/pull/3187 (FSDP checkpoints saved rank 0's RNG state and restored "
               "it on every rank)",
        edits={
            _RNG_SAVE: '    if dist.get_rank() == 0:\n        torch.save(rng, staged / "rng.pt")  # one RNG file for the job\n',
            '    rng_file = path / f"rng-rank{dist.get_rank()}.pt"\n': '    rng_file = path / "rng.pt"\n',
        },
        key_terms=("RNG",),
    ),
    Mistake(
        name="reseed_after_load",
        what="torch.manual_seed(seed + rank) runs after load_checkpoint, overwriting the RNG state just restored.",
        source="https://github.com/modelscope/ms-swift/pull/9935 (set_random_seed after the checkpoint load "
               "replaced the restored RNG position)",
        edits={"    torch.manual_seed(seed + dist.get_rank())\n"
               "    step, position = 0, {\"epoch\": 0, \"samples\": 0}\n"
               "    resumed = load_checkpoint(root, model, optimizer, scheduler)\n":
               "    step, position = 0, {\"epoch\": 0, \"samples\": 0}\n"
               "    resumed = load_checkpoint(root, model, optimizer, scheduler)\n"
               "    torch.manual_seed(seed + dist.get_rank())\n"},
        key_terms=("seed",),
    ),
    Mistake(
        name="scheduler_not_restored",
        what="The scheduler's state is saved but never loaded, so the cosine schedule restarts from step 0 "
             "after a resume.",
        source="https://theneuralbase.com/huggingface-fine-tuning/learn/beginner/checkpoint-resume-issues/ "
               "(resume must align weights, optimizer and scheduler position)",
        edits={'    scheduler.load_state_dict(state["scheduler"])\n': ""},
        key_terms=("scheduler",),
    ),
    Mistake(
        name="data_offset_ignored",
        what="The resumed epoch restarts from its first batch: the saved position is never used, so batches are "
             "trained twice.",
        source="course/05_checkpointing.py's table: the data position is 'sampler epoch + offset'",
        edits={"        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n":
               "        for first in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n"},
        key_terms=("data position",),
    ),
    Mistake(
        name="data_offset_off_by_one",
        what="The checkpoint records the position before the batch just trained, not after it, so a resumed "
             "run repeats that batch.",
        source="classic off-by-one in a resumable data position (contract: 'the ranks together have used the "
               "first n samples')",
        edits={"""            used += world * BATCH_SIZE
            if step % save_every == 0:
                save_checkpoint(root, step, model, optimizer, scheduler, {"epoch": epoch, "samples": used}, keep)
""": """            if step % save_every == 0:
                save_checkpoint(root, step, model, optimizer, scheduler, {"epoch": epoch, "samples": used}, keep)
            used += world * BATCH_SIZE
"""},
        key_terms=("data position",),
    ),
    Mistake(
        name="per_rank_batch_offset",
        what="The data position is this rank's batch count (what most tutorials save, and what a resume at the "
             "same world size gets away with): resumed with more ranks, each rank's batch count means more "
             "samples of the stream, and the job skips ahead.",
        source="https://github.com/pytorch/pytorch/issues/59983 (DistributedSampler has no state to resume "
               "from; tutorials save the batch index) and torchdata's StatefulDataLoader, whose state is per rank",
        edits={"        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n":
               "        for first in range(used * BATCH_SIZE, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n",
               "            used += world * BATCH_SIZE\n": "            used += 1  # batches of this rank\n"},
        key_terms=("world size",),
    ),
    Mistake(
        name="no_set_epoch",
        what="sampler.set_epoch(epoch) is never called, so every epoch replays epoch 0's order.",
        source="DistributedSampler docs warning (https://discuss.pytorch.org/t/distributedsampler/90205/2)",
        edits={"        sampler.set_epoch(epoch)\n": ""},
        key_terms=("set_epoch",),
    ),
    Mistake(
        name="written_in_place_not_committed",
        what="The checkpoint is written straight into step_N (no staging directory, no commit), so a crash "
             "mid-write can leave a step_N that looks complete but lacks files.",
        source="course/05_checkpointing.py: 'If the new checkpoint is written in place, the newest directory is "
               "half-written and the next start loads garbage'",
        edits={"    staged = staging_path(root, step)\n": "    staged = final_path(root, step)\n", _COMMIT: ""},
        key_terms=("atomic",),
    ),
    Mistake(
        name="no_barrier_before_commit",
        what="Rank 0 commits right after its own RNG file is written, without the barrier, so the rename can "
             "race the other ranks' RNG files.",
        source="course/05_checkpointing.py: 'each rank writes its RNG file after dcp.save, so the barrier before "
               "the commit is needed again'",
        edits={"    dist.barrier()  # every rank's shard and RNG file are on disk\n": ""},
        key_terms=("barrier",),
    ),
    Mistake(
        name="dcp_save_on_rank0_only",
        what="Only rank 0 calls dcp.save, a collective that every rank must join (each writes its own shards).",
        source="https://github.com/deepspeedai/DeepSpeed/pull/801 (checkpoint save called on rank 0 only hangs); "
               "torch.save habit",
        edits={"    dcp.save(state, checkpoint_id=staged)\n":
               "    if dist.get_rank() == 0:\n        dcp.save(state, checkpoint_id=staged)  # one writer, like torch.save\n"},
        key_terms=("every rank",),
    ),
    Mistake(
        name="newest_directory_including_staging",
        what="load_checkpoint picks the newest *step_* directory by number, .tmp- staging directories included, "
             "instead of latest_complete.",
        source="course/05_checkpointing.py: 'Find it with latest_complete(root) (never a .tmp- directory)'",
        edits={"    found = latest_complete(root)\n    if found is None:\n        return None\n    _, path = found\n":
               "    candidates = sorted(Path(root).glob(\"*step_*\"), key=lambda p: int(p.name.rsplit(\"_\", 1)[1]))\n"
               "    if not candidates:\n        return None\n"
               "    path = candidates[-1]  # the newest checkpoint directory\n"},
        key_terms=("tmp",),
    ),
    Mistake(
        name="fsdp1_optimizer_load",
        what="The optimizer is loaded FSDP1-style (FSDP.optim_state_dict_to_load then optimizer.load_state_dict), "
             "which does not work on a fully_shard model.",
        source="course/05_checkpointing.py: 'The optimizer is where FSDP1-era code breaks' "
               "(FSDP.optim_state_dict_to_load + optim.load_state_dict)",
        edits={_SET: """\
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, state["optim"]))
"""},
        key_terms=("set_state_dict",),
    ),
]

LEGAL: list[Mistake] = [
    Mistake(
        name="separate_model_and_optimizer_state_dicts",
        what="get_model_state_dict/get_optimizer_state_dict and set_model_state_dict/set_optimizer_state_dict "
             "replace the combined get_state_dict/set_state_dict.",
        source="course/05_checkpointing.py names both spellings (get_optimizer_state_dict / set_optimizer_state_dict)",
        edits={
            "from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict\n":
                "from torch.distributed.checkpoint.state_dict import (\n"
                "    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict)\n",
            _SAVE_STATE: _SAVE_STATE.replace("    model_sd, optim_sd = get_state_dict(model, optimizer)\n",
                                             "    model_sd = get_model_state_dict(model)\n"
                                             "    optim_sd = get_optimizer_state_dict(model, optimizer)\n"),
            _LOAD_STATE: _LOAD_STATE.replace("    model_sd, optim_sd = get_state_dict(model, optimizer)\n",
                                             "    model_sd = get_model_state_dict(model)\n"
                                             "    optim_sd = get_optimizer_state_dict(model, optimizer)\n"),
            _SET: '    set_model_state_dict(model, state["model"])\n'
                  '    set_optimizer_state_dict(model, optimizer, state["optim"])\n',
        },
    ),
    Mistake(
        name="rng_file_written_before_dcp_save",
        what="Each rank writes its RNG file into the staging directory (created first) before dcp.save rather "
             "than after; the barrier and the commit stay.",
        source="another order of the same writes (torchtitan-style extras written beside the DCP shards)",
        edits={"""\
    dcp.save(state, checkpoint_id=staged)
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")
""": """\
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        rng["cuda"] = torch.cuda.get_rng_state()
    staged.mkdir(parents=True, exist_ok=True)
    torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")
    dcp.save(state, checkpoint_id=staged)
"""},
    ),
]

# Written blind to the checks by a second tester (issue: the data position {"epoch", "samples"} of the global
# stream, and a resume at another world size); checked against the contract with a scratch harness.
_FOR = "        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n"
_POSITION = '    epoch, used = position["epoch"], position["samples"]\n'
_SAVED = '{"epoch": epoch, "samples": used}, keep)'
_LOAD_DATA = '"step": 0, "data": {"epoch": 0, "samples": 0}}'

MISTAKES += [
    Mistake(
        name="start_divided_by_saved_world_size",
        what="The world size is saved with the position and the rank's start is n // W_saved (the ranks that "
             "counted the samples) instead of n / W' of the ranks now running, so a resume with more ranks skips.",
        source="the contract: 'the next batch of rank r is ... from index n / W'' (W' the new world size), easily "
               "read as the saving world's",
        edits={_SAVED: '{"epoch": epoch, "samples": used, "world": world}, keep)',
               _LOAD_DATA: '"step": 0, "data": {"epoch": 0, "samples": 0, "world": 0}}',
               _POSITION: _POSITION + '    saved_world = position.get("world") or world  # the ranks that counted '
                                      '`used`\n',
               _FOR: _FOR.replace("used // world", "used // saved_world")},
        key_terms=("world size",),
    ),
    Mistake(
        name="samples_counted_per_rank",
        what="'samples' counts this rank's samples (len(batch) a step) rather than the W * BATCH_SIZE the ranks "
             "used together, while the start still divides by W: a resume lands W times too early and repeats data.",
        source="torchdata StatefulDataLoader's per-rank '_num_yielded'/samples_yielded, the counter people copy "
               "into a global-position field",
        edits={"            used += world * BATCH_SIZE\n": "            used += len(batch)  # samples used\n"},
        key_terms=("data position",),
    ),
    Mistake(
        name="global_count_as_rank_offset",
        what="The saved global sample count is used directly as the index into this rank's share (no division by "
             "the world size), so a resumed rank skips ahead by a factor of W.",
        source="the contract's 'the ranks together have used the first n samples' vs 'from index n / W'' of the "
               "rank's sampler (a forgotten / W)",
        edits={_FOR: _FOR.replace("range(used // world,", "range(used,")},
        key_terms=("data position",),
    ),
    Mistake(
        name="position_from_global_step",
        what="The saved position is ignored and the data position is derived from the step counter "
             "(epoch = step // steps_per_epoch, offset = step % steps_per_epoch) at the current world size, which "
             "only holds when the job resumes with the number of ranks that saved it.",
        source="HF transformers Trainer resume: epochs_trained = global_step // num_update_steps_per_epoch, "
               "steps_trained_in_current_epoch = global_step % num_update_steps_per_epoch",
        edits={_POSITION: "    per_epoch = len(sampler) // BATCH_SIZE  # steps in an epoch\n"
                          "    epoch, used = step // per_epoch, step % per_epoch * world * BATCH_SIZE  # like HF "
                          "Trainer\n"},
        key_terms=("world size",),
    ),
    Mistake(
        name="skip_whole_batches_rounded_down",
        what="The resume skips used // (W' * BATCH_SIZE) whole batches of the rank's share (accelerate-style "
             "skip_first_batches via itertools.islice), dropping the remainder: resumed with more ranks, a position "
             "mid-batch rounds down and samples are trained twice.",
        source="HF accelerate skip_first_batches(dataloader, num_batches) / itertools.islice over the batches "
               "(a batch count, not a sample position)",
        edits={"from pathlib import Path\n": "import itertools\nfrom pathlib import Path\n",
               _FOR: "        batches = [order[i:i + BATCH_SIZE] for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE)]\n"
                     "        for indices in itertools.islice(batches, used // (world * BATCH_SIZE), None):  # skip done\n",
               "            batch = [dataset[i] for i in order[first:first + BATCH_SIZE]]\n":
               "            batch = [dataset[i] for i in indices]\n"},
        key_terms=("data position",),
    ),
    Mistake(
        name="restart_epoch_on_world_change",
        what="When the job resumes with another number of ranks the saved offset is thrown away and the epoch "
             "restarts from its first sample (set_epoch(epoch), offset 0), so the samples already used are seen "
             "twice.",
        source="torchtitan's ParallelAwareDataloader: 'dp_degree is inconsistent before and after checkpoint, "
               "dataloader resharding is not supported yet' (downgraded to a restart)",
        edits={_SAVED: '{"epoch": epoch, "samples": used, "world": world}, keep)',
               _LOAD_DATA: '"step": 0, "data": {"epoch": 0, "samples": 0, "world": 0}}',
               _POSITION: _POSITION + '    if position.get("world", world) != world:  # resharding unsupported'
                                      '\n        used = 0  # another number of ranks: start the epoch '
                                      'again\n'},
        key_terms=("world size",),
    ),
    Mistake(
        name="set_epoch_only_on_rollover",
        what="sampler.set_epoch is called only when the epoch advances, so a run resumed in epoch e > 0 reads "
             "epoch 0's shuffled order until the next epoch boundary.",
        source="https://github.com/huggingface/accelerate/issues/3996 (DataLoader shuffle replays from epoch 0 "
               "after resuming from a checkpoint)",
        edits={"        sampler.set_epoch(epoch)\n": "",
               "            epoch, used = epoch + 1, 0\n":
               "            epoch, used = epoch + 1, 0\n            sampler.set_epoch(epoch)\n"},
        key_terms=("set_epoch",),
    ),
]

LEGAL += [
    Mistake(
        name="rank_offset_scaled_at_save",
        what="The loop keeps this rank's own index into its share and converts it to the global stream only when "
             "saving (samples = next index * W), loading it back as n // W'.",
        source="the contract: rank r deals at r, r + W, ...; its next index n / W is the per-rank offset",
        edits={"            used += world * BATCH_SIZE\n": "",
               _SAVED: '{"epoch": epoch, "samples": (first + BATCH_SIZE) * world}, keep)'},
    ),
    Mistake(
        name="sampler_fast_forwarded_with_islice",
        what="The resumed epoch's sampler is fast-forwarded past the used samples with "
             "itertools.islice(sampler, n // W', None) (per sample, not per batch), then batched from its start.",
        source="torchdata StatefulDataLoader's fast-forward of a sampler by samples_yielded, per sample",
        edits={"from pathlib import Path\n": "import itertools\nfrom pathlib import Path\n",
               "        order = list(sampler)  # this rank's indices for the whole epoch: the global stream's r, r + W, ...\n":
               "        order = list(itertools.islice(sampler, used // world, None))  # past the samples used\n",
               _FOR: _FOR.replace("range(used // world,", "range(0,")},
    ),
]
