"""Realistic mistakes for exercise 1 (DDP: setup, train_ddp, evaluate_ddp, and BucketedDDP), and legal other styles.

The BucketedDDP ones (``_BUCKETED``) were written, as whole files, by a tester who had read only the contract
(session of 2026-12-06), before the check was changed for them; they are the same mistakes as edits of the
reference. The check was then changed for five of them (the note of that session says which)."""
from __future__ import annotations

from benchmarks.realistic import Mistake

_EVAL_MASK = """\
            position = torch.arange(seen, seen + len(y), device=device) * world + rank
            real = position < len(dataset)
            seen += len(y)
            logits = model(x)[real]
            totals[0] += nn.functional.cross_entropy(logits, y[real], reduction="sum")
            totals[1] += (logits.argmax(dim=-1) == y[real]).sum()
            totals[2] += real.sum()
"""

_EVAL_REDUCE = """\
    dist.all_reduce(totals)  # sums, not means: the shards hold different numbers of real samples
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()
"""

_EVAL_BODY = """\
    shard = DistributedSampler(dataset, shuffle=False)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, samples counted
    seen = 0
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=batch_size, sampler=shard):
            x, y = x.to(device), y.to(device)
            # The sampler pads the index list to W * ceil(n / W) by repeating its head, then deals it out:
            # this rank's j-th sample is position j * W + rank, and positions from n on are the repeats.
""" + _EVAL_MASK + _EVAL_REDUCE

MISTAKES: list[Mistake] = [
    Mistake(
        name="no_set_epoch",
        what="sampler.set_epoch(epoch) is never called, so every epoch repeats epoch 0's shuffle.",
        source="https://discuss.pytorch.org/t/distributedsampler/90205/2 (DistributedSampler docs warn: set_epoch "
               "before each epoch, else the same ordering is always used)",
        edits={"        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's shuffle\n": ""},
        key_terms=("set_epoch",),
    ),
    Mistake(
        name="sampler_not_passed_to_loader",
        what="The DistributedSampler is built but the DataLoader shuffles the whole data set itself, so every "
             "rank reads all samples instead of its own shard.",
        source="forum classic 'each GPU sees the whole dataset with DDP'; cf. "
               "https://github.com/deepspeedai/DeepSpeedExamples/pull/804 (sampler overwritten, every rank reads all)",
        edits={"loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)":
               "loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)"},
        key_terms=("shard",),
    ),
    Mistake(
        name="batch_size_split_over_ranks",
        what="batch_size is treated as the global batch and divided by the world size, but the contract makes "
             "it per rank (global batch W * batch_size).",
        source="forum question 'should I divide the batch size by the number of GPUs with DDP?' "
               "(DataParallel habit, where batch_size is global)",
        edits={"loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)":
               "loader = DataLoader(dataset, batch_size=batch_size // dist.get_world_size(), sampler=sampler)"},
        key_terms=("batch_size",),
    ),
    Mistake(
        name="print_on_every_rank",
        what="The epoch loss is printed by every rank, not by rank 0 only.",
        source="PyTorch DDP tutorial habit of a plain print in the loop; ex01's contract: nothing printed on "
               "other ranks",
        edits={"""\
        if rank == 0:
            # Rank 0's own shard: averaging over ranks would need an all_reduce, not worth it for a log.
            print(f"epoch {epoch}: mean loss {total.item() / len(loader):.4f} (rank 0 shard)")
""": """\
        print(f"epoch {epoch}: mean loss {total.item() / len(loader):.4f}")
"""},
        key_terms=("rank 0",),
    ),
    Mistake(
        name="save_on_every_rank",
        what="Every rank calls torch.save on the same checkpoint_path, not rank 0 only.",
        source="PyTorch DDP tutorial's checkpointing section warns to save on one process only; common forum bug "
               "(concurrent writes to one file)",
        edits={"    if rank == 0:\n        torch.save(ddp_model.module.state_dict(), checkpoint_path)\n":
               "    torch.save(ddp_model.module.state_dict(), checkpoint_path)\n"},
        key_terms=("rank 0",),
    ),
    Mistake(
        name="save_wrapped_state_dict",
        what="The DDP wrapper's state_dict is saved, so every key carries the 'module.' prefix.",
        source="https://kiwix.lema.org/stackoverflow.com_en_all_2023-11/questions/61854165/why-must-use-dataparallel-"
               "when-testing ('Unexpected key(s): module.conv1.weight')",
        edits={"torch.save(ddp_model.module.state_dict(), checkpoint_path)":
               "torch.save(ddp_model.state_dict(), checkpoint_path)"},
        key_terms=("module.",),
    ),
    Mistake(
        name="device_ids_global_rank",
        what="DDP is given device_ids=[rank] (the global rank) instead of the local device's index.",
        source="course/01_ddp.py warns: 'The global rank used as the GPU index: DDP(model, device_ids=[rank])' "
               "fails on a second node",
        edits={'ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)':
               'ddp_model = DDP(model, device_ids=[rank] if device.type == "cuda" else None)'},
        key_terms=("device_ids",),
    ),
    Mistake(
        name="hardcoded_master_port",
        what="setup overwrites torchrun's MASTER_ADDR/MASTER_PORT with localhost:12355 before "
             "init_process_group, so the ranks look for a store nobody hosts.",
        source="PyTorch DDP tutorial habit (mp.spawn examples set os.environ['MASTER_PORT'] = '12355')",
        edits={
            "from datetime import timedelta\n": "import os\nfrom datetime import timedelta\n",
            "    dist.init_process_group(backend=distlab.backend(), timeout=timedelta(seconds=60))\n":
                '    os.environ["MASTER_ADDR"] = "localhost"\n'
                '    os.environ["MASTER_PORT"] = "12355"\n'
                "    dist.init_process_group(backend=distlab.backend(), timeout=timedelta(seconds=60))\n",
        },
        key_terms=("MASTER_PORT",),
    ),
    Mistake(
        name="eval_counts_padded_duplicates",
        what="evaluate_ddp counts every sample the sampler yields, so the head samples DistributedSampler "
             "repeats to pad the shards are counted twice.",
        source="https://github.com/pytorch/pytorch/issues/25162 (Incorrect Validation Accuracy Due to "
               "Distributed Sampler)",
        edits={_EVAL_MASK: """\
            logits = model(x)
            totals[0] += nn.functional.cross_entropy(logits, y, reduction="sum")
            totals[1] += (logits.argmax(dim=-1) == y).sum()
            totals[2] += len(y)
"""},
        key_terms=("pad",),
    ),
    Mistake(
        name="eval_no_all_reduce",
        what="evaluate_ddp returns each rank's metrics over its own shard, never combined over the ranks.",
        source="https://github.com/mlfoundations/open_clip/pull/176 (distributed eval: each rank's number is "
               "only its shard's); course/01_ddp.py: 'each rank's number is only its shard's'",
        edits={"    dist.all_reduce(totals)  # sums, not means: the shards hold different numbers of real samples\n":
               ""},
        key_terms=("shard",),
    ),
    Mistake(
        name="eval_mean_of_rank_means",
        what="Each rank's mean loss and accuracy are averaged over the ranks, though the shards hold "
             "different numbers of real samples (a mean of means, not the mean).",
        source="https://github.com/RUCAIBox/RecBole/pull/1872 (DDP eval recombined per-rank averages wrongly)",
        edits={_EVAL_REDUCE: """\
    metrics = torch.stack([totals[0] / totals[2], totals[1] / totals[2]])
    dist.all_reduce(metrics)  # average the ranks' results
    metrics /= world
    return metrics[0].item(), metrics[1].item()
"""},
        key_terms=("mean",),
    ),
    Mistake(
        name="eval_drop_last",
        what="The evaluation sampler is built with drop_last=True to avoid the duplicates, which drops the "
             "tail samples so not every sample is counted.",
        source="https://github.com/pytorch/pytorch/issues/25162 (drop_last suggested as the fix for duplicated "
               "eval samples)",
        edits={"shard = DistributedSampler(dataset, shuffle=False)":
               "shard = DistributedSampler(dataset, shuffle=False, drop_last=True)"},
        key_terms=("drop_last",),
    ),
    Mistake(
        name="eval_contiguous_shard_assumption",
        what="The padding mask assumes each rank holds a contiguous block of the index list (rank * len + j), "
             "while DistributedSampler deals indices out strided (j * W + rank): right count, wrong samples "
             "dropped at W=4.",
        source="https://pytorch.org/docs/0.3.0/_modules/torch/utils/data/distributed.html (the old sampler cut "
               "contiguous blocks; tutorials still describe it so)",
        edits={"""\
            # The sampler pads the index list to W * ceil(n / W) by repeating its head, then deals it out:
            # this rank's j-th sample is position j * W + rank, and positions from n on are the repeats.
            position = torch.arange(seen, seen + len(y), device=device) * world + rank
""": """\
            # The sampler pads the index list to W * ceil(n / W): this rank holds positions
            # rank * len(shard) onwards, and positions from n on are the repeats.
            position = rank * len(shard) + torch.arange(seen, seen + len(y), device=device)
"""},
        key_terms=("pad",),
    ),
]


_CONTRACT = "written blind to the checks from BucketedDDP's contract (Li et al. 2020's buckets; CS336 assignment 2)"
_LAUNCH = "            self.launched[i] = (dist.all_reduce(flat, async_op=True), flat)"
_BUCKETED: list[Mistake] = [
    Mistake("bucketed_no_divide", "The bucket's all-reduced sum is written back without dividing by the world size.",
            _CONTRACT, {"(flat / world).split(": "flat.split("}, ("world size",)),
    Mistake("bucketed_divide_twice", "The gradients are divided by the world size before and after the all-reduce.",
            _CONTRACT, {"(flat / world).split(": "(flat / world / world).split("}, ("world size",)),
    Mistake("bucketed_wait_in_hook", "Each bucket's Work is waited on in the hook that launched it: the backward "
            "stops at every bucket.", _CONTRACT, {_LAUNCH: _LAUNCH + "\n            self.launched[i][0].wait()"},
            ("waited",)),
    Mistake("bucketed_launch_in_finish", "The hooks only count; every bucket is launched in "
            "finish_gradient_synchronization, after the backward.", _CONTRACT,
            {"                launch(i)\n": "                pass\n"}, ("after the backward",)),
    Mistake("bucketed_per_parameter", "One all-reduce per parameter: every parameter closes its bucket.", _CONTRACT,
            {"            if size >= cap:": "            if True:"}, ("per parameter",)),
    Mistake("bucketed_forward_order", "The buckets are filled in module.parameters()'s order, not in reverse.",
            _CONTRACT, {"if p.requires_grad][::-1]": "if p.requires_grad]"}, ("reverse",)),
    Mistake("bucketed_cap_strict", "A bucket closes only once it exceeds the cap (>), not when it reaches it.",
            _CONTRACT, {"            if size >= cap:": "            if size > cap:"}, ("reach",)),
    Mistake("bucketed_megabytes", "bucket_cap_mb is read as 10**6 bytes, not MiB.", _CONTRACT,
            {"size = bucket_cap_mb * 2**20": "size = bucket_cap_mb * 10**6"}, ("MiB",)),
    Mistake("bucketed_no_copy_back", "The flattened bucket is all-reduced, but the result never reaches .grad.",
            _CONTRACT, {"                    p.grad.copy_(mean.view_as(p))": "                    pass"},
            ("write the reduced",)),
    Mistake("bucketed_no_reset", "The buckets' state is not reset after a step: the second backward finds every "
            "bucket launched.", _CONTRACT,
            {"        self.pending = [len(b) for b in self.buckets]  # ready for the next backward\n"
             "        self.launched = [None] * len(self.buckets)\n": ""}, ("step 1",)),
    Mistake("bucketed_no_broadcast", "The parameters are not broadcast from rank 0 at construction.", _CONTRACT,
            {"            dist.broadcast(p.data, src=0)": "            pass"}, ("broadcast",)),
    Mistake("bucketed_tensor_hook", "register_hook (which runs before .grad is accumulated) instead of "
            "register_post_accumulate_grad_hook.", _CONTRACT,
            {"p.register_post_accumulate_grad_hook(ready)": "p.register_hook(lambda g, p=p: ready(p))"},
            ("register_hook",)),
    Mistake("bucketed_synchronous", "The all-reduce is called without async_op=True inside the hook.", _CONTRACT,
            {_LAUNCH: "            dist.all_reduce(flat)\n            self.launched[i] = (None, flat)",
             "            work.wait()": "            work is None or work.wait()"}, ("synchronous",)),
    Mistake("bucketed_unused_skipped", "Buckets no hook completed (an unused parameter's) are skipped, not launched.",
            _CONTRACT, {"                self.launch(i)": "                pass",
                        "zip(self.buckets, self.launched):": "((b, l) for b, l in zip(self.buckets, self.launched) if l):"},
            ("never all-reduced",)),
]
MISTAKES += _BUCKETED
LEGAL: list[Mistake] = [
    Mistake(
        name="eval_real_count_per_rank",
        what="The padding mask is written as 'this rank's first len(range(rank, n, W)) samples are real' "
             "instead of comparing global positions with n.",
        source="another correct reading of DistributedSampler.__iter__ (strided dealing, repeats at the end)",
        edits={"""\
            position = torch.arange(seen, seen + len(y), device=device) * world + rank
            real = position < len(dataset)
""": """\
            mine = len(range(rank, len(dataset), world))  # this rank's real samples come first
            real = torch.arange(seen, seen + len(y), device=device) < mine
"""},
    ),
    Mistake(
        name="optimizer_on_plain_model_saved_unwrapped",
        what="The optimizer is built over model.parameters() before wrapping (DDP keeps the very same "
             "tensors), rank 0 saves model.state_dict() of the original module, and the plain model is returned.",
        source="PyTorch DDP tutorial style (optimizer over the module; DDP does not replace parameters)",
        edits={
            '    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)\n'
            "    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr)\n":
                "    optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # DDP keeps these very tensors\n"
                '    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)\n',
            "        torch.save(ddp_model.module.state_dict(), checkpoint_path)\n    return ddp_model\n":
                "        torch.save(model.state_dict(), checkpoint_path)  # the unwrapped module itself\n"
                "    return model\n",
        },
    ),
    Mistake(
        name="eval_gather_per_index_dedupe",
        what="evaluate_ddp keeps each sample's loss and hit keyed by its dataset index, all_gather_objects the "
             "dicts and merges them, so a padded repeat (a repeated index) counts once.",
        source="https://github.com/huggingface/transformers/issues/3944 (distributed eval by gathering results and "
               "dropping the dummy samples)",
        edits={_EVAL_BODY: """\
    shard = DistributedSampler(dataset, shuffle=False)
    order = list(shard)  # this rank's dataset indices, in the order the loader yields them
    results: dict[int, tuple[float, int]] = {}
    seen = 0
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=batch_size, sampler=shard):
            x, y = x.to(device), y.to(device)
            logits = model(x)
            losses = nn.functional.cross_entropy(logits, y, reduction="none").double()
            hits = logits.argmax(dim=-1) == y
            for j in range(len(y)):
                results[order[seen + j]] = (losses[j].item(), int(hits[j].item()))
            seen += len(y)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, results)
    merged: dict[int, tuple[float, int]] = {}
    for part in everyone:
        merged.update(part)  # a padded repeat carries the index of a sample already there
    loss = sum(value[0] for value in merged.values()) / len(merged)
    accuracy = sum(value[1] for value in merged.values()) / len(merged)
    return float(loss), float(accuracy)
"""},
    ),
    Mistake(
        name="bucketed_divide_first",
        what="BucketedDDP divides each gradient by the world size before the all-reduce (the sum of the quotients "
             "is the mean).",
        source=_CONTRACT,
        edits={"            flat = torch.cat(grads)": "            flat = torch.cat(grads) / dist.get_world_size()",
               "(flat / world).split(": "flat.split("},
    ),
]
