"""Exercise 1: from one process to DistributedDataParallel.

``train_single`` below is a working single-process training loop. Turn it
into ``train_ddp``, which torchrun runs on every rank, so that W processes
together do exactly what ``train_single`` would do with a global batch of
``W * batch_size``:

1. ``setup``: join the process group torchrun prepared (``RANK``,
   ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` are in the environment).
2. Give each rank its own shard of the data with a ``DistributedSampler``, and
   call ``set_epoch`` every epoch so the shuffle changes between epochs.
3. Wrap the model in ``DistributedDataParallel``: it broadcasts rank 0's
   weights at construction and all-reduces (averages) gradients in backward.
4. Log and save on rank 0 only: every rank holds the same model.
5. ``evaluate_ddp``: evaluate a model over a data set that the world size
   does not divide, sharded like training, counting every sample once.
6. ``BucketedDDP``: what ``DistributedDataParallel`` does inside, by hand:
   gradient buckets all-reduced while the backward still runs.
7. ``teardown``: leave the process group.

Check your work from the repository's root with ``make grade`` (every
exercise) or ``.venv/bin/python -m autograder grade --exercise 1`` (this one),
or with ``check(1)`` in the notebook ``course/01_ddp``. Every function raises
``NotImplementedError`` until you fill it in.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import distlab


def train_single(model: nn.Module, dataset: Dataset, *, epochs: int, batch_size: int, lr: float,
                 seed: int, checkpoint_path: str | Path) -> nn.Module:
    """The single-process loop you start from (given, not graded).

    Plain SGD on the mean cross-entropy of each batch; the loss of each epoch
    is printed; the trained weights are saved to ``checkpoint_path``.
    """
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        total = 0.0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.4f}")
    torch.save(model.state_dict(), checkpoint_path)
    return model


def setup() -> torch.device:
    """Initialise the default process group from torchrun's environment; return this rank's device.

    Use ``distlab.backend()`` for the backend ("nccl" on GPUs, "gloo" on the
    CPU) and pass a ``timeout`` (say 60 s) so a hang fails fast instead of
    after the 10-30 minute default. On NCCL, also ``torch.cuda.set_device``,
    *before* ``init_process_group`` (until then the current GPU is ``cuda:0``,
    where the group's first work would land). Return ``distlab.device()``:
    ``cuda:LOCAL_RANK``, the GPU on this machine, never ``cuda:RANK`` (on a
    second node the global rank is not a GPU index).
    """
    ### BEGIN SOLUTION
    device = distlab.device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=distlab.backend(), timeout=timedelta(seconds=60))
    return device
    ### END SOLUTION


def teardown() -> None:
    """Destroy the default process group."""
    ### BEGIN SOLUTION
    dist.destroy_process_group()
    ### END SOLUTION


def train_ddp(model: nn.Module, dataset: Dataset, *, epochs: int, batch_size: int, lr: float,
              seed: int, checkpoint_path: str | Path) -> nn.Module:
    """``train_single`` on every rank, made data-parallel. Called after ``setup()``.

    Contract (the grader checks each point):

    * ``batch_size`` is per rank: each step, every rank takes ``batch_size``
      samples from its own shard, so the global batch is ``W * batch_size``.
    * Shard with ``DistributedSampler(dataset, shuffle=True, seed=seed)``
      (do not pass ``shuffle=True`` to the ``DataLoader`` as well) and call
      ``sampler.set_epoch(epoch)`` at the start of every epoch.
    * Wrap ``model`` (already on this rank's device) in ``DistributedDataParallel``
      (on a GPU, ``device_ids=[that device's index]``, not ``[rank]``)
      and optimise it with ``torch.optim.SGD(..., lr=lr)`` on the mean cross-entropy.
    * Print the epoch loss on rank 0 only; nothing is printed on other ranks.
    * Save ``model.module.state_dict()`` (the unwrapped model, so its keys have
      no ``module.`` prefix) with ``torch.save`` to ``checkpoint_path``, on rank 0 only.
    * Return the trained model (wrapped or not).
    """
    ### BEGIN SOLUTION
    rank = dist.get_rank()
    device = next(model.parameters()).device
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    # DDP broadcasts rank 0's parameters now, and averages gradients during backward.
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's shuffle
        total = torch.zeros((), device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
        if rank == 0:
            # Rank 0's own shard: averaging over ranks would need an all_reduce, not worth it for a log.
            print(f"epoch {epoch}: mean loss {total.item() / len(loader):.4f} (rank 0 shard)")
    if rank == 0:
        torch.save(ddp_model.module.state_dict(), checkpoint_path)
    return ddp_model
    ### END SOLUTION


def evaluate_ddp(model: nn.Module, dataset: Dataset, *, batch_size: int) -> tuple[float, float]:
    """The mean cross-entropy and the accuracy of ``model`` over ``dataset``, computed by all ranks together.

    Contract (the grader checks each point, with ``len(dataset)`` not divisible by the world size, then divisible):

    * Called after ``setup()`` on every rank, with the same ``model`` (a plain module, on this rank's
      device, not wrapped) on every rank. Do not train: run the model under ``torch.no_grad()`` (or
      ``torch.inference_mode()``), so that autograd records nothing.
    * Each rank evaluates only its own shard: ``DistributedSampler(dataset, shuffle=False)`` (with its
      default ``drop_last=False``) in a ``DataLoader`` of ``batch_size``. No rank reads more than
      ``ceil(len(dataset) / W)`` samples.
    * The sampler gives every rank the same number of samples: when ``W`` does not divide
      ``len(dataset)`` it pads the shards, and some samples then reach the model twice. Every sample of
      ``dataset`` must count exactly once (read how ``DistributedSampler.__iter__`` pads and shards).
    * Return ``(loss, accuracy)`` as Python floats, the same on every rank: the mean cross-entropy over
      the ``len(dataset)`` samples and the fraction of them whose arg-max logit is the label, equal (to
      float rounding) to what one process computes over the whole data set.
    """
    ### BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    device = next(model.parameters()).device
    shard = DistributedSampler(dataset, shuffle=False)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, samples counted
    seen = 0
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=batch_size, sampler=shard):
            x, y = x.to(device), y.to(device)
            # The sampler pads the index list to W * ceil(n / W) by repeating its head, then deals it out:
            # this rank's j-th sample is position j * W + rank, and positions from n on are the repeats.
            position = torch.arange(seen, seen + len(y), device=device) * world + rank
            real = position < len(dataset)
            seen += len(y)
            logits = model(x)[real]
            totals[0] += nn.functional.cross_entropy(logits, y[real], reduction="sum")
            totals[1] += (logits.argmax(dim=-1) == y[real]).sum()
            totals[2] += real.sum()
    dist.all_reduce(totals)  # sums, not means: the shards hold different numbers of real samples
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()
    ### END SOLUTION


class BucketedDDP(nn.Module):
    """Data parallelism by hand: DDP's gradient buckets, each all-reduced as soon as its gradients are ready.

    Per-parameter all-reduces pay a collective's latency once per tensor; one all-reduce after the backward
    leaves the network idle while it runs and the GPU idle while it communicates. DDP (Li et al., 2020,
    "PyTorch Distributed", VLDB, sec. 3.2) groups the gradients into buckets of about ``bucket_cap_mb`` and
    all-reduces each bucket, asynchronously, the moment its last gradient is accumulated, so that
    communication overlaps the rest of the backward. The grader runs, on every rank and each step::

        loss = loss_fn(ddp(x), y)          # forward through the wrapper, on this rank's slice of the batch
        optimizer.zero_grad()
        loss.backward()                    # your hooks launch the buckets' all-reduces in here
        ddp.finish_gradient_synchronization()
        optimizer.step()                   # over ddp.module's parameters

    Contract (the grader checks each point):

    * ``BucketedDDP(module, bucket_cap_mb)`` is built after ``setup()`` on every rank. It broadcasts every
      parameter of ``module`` from rank 0, so that every rank starts from rank 0's weights. ``self.module`` is
      ``module``, and ``forward(*args, **kwargs)`` is ``module``'s.
    * **Buckets**: the parameters that require a gradient, in the reverse of ``module.parameters()``'s order
      (the order their gradients roughly become ready in the backward). A bucket takes them in that order
      until its bytes (``numel() * element_size()`` summed) reach ``bucket_cap_mb * 2**20`` or more; the next
      parameter starts a new bucket. A parameter is never split: one larger than the cap is a bucket of its
      own, and a cap larger than the model makes one bucket.
    * **Overlap**: a hook on every such parameter (``register_post_accumulate_grad_hook``) notes its gradient
      ready; when the last gradient of a bucket is ready, one asynchronous all-reduce
      (``dist.all_reduce(flat, async_op=True)``) of the bucket's gradients, flattened into one tensor,
      starts at once, inside the backward. One all-reduce per bucket and step, no other collective.
    * ``finish_gradient_synchronization()`` waits for every bucket's all-reduce and leaves in each
      parameter's ``.grad`` the mean over the ranks (the sum divided by the world size), ready for the
      step, and readies the buckets for the next backward.
    * **A parameter unused in the forward** gets no gradient, and its hook never runs, so its bucket never
      completes during the backward. Either handle it: ``finish_gradient_synchronization`` then launches
      every bucket not yet launched, counting a missing gradient as zeros, and every other parameter's
      ``.grad`` is still the mean (the unused one's ``.grad`` may stay ``None`` or hold zeros); or name it:
      raise an error whose message holds the parameter's name in ``module.named_parameters()``.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float):
        super().__init__()
        self.module = module
        ### BEGIN SOLUTION
        for p in module.parameters():  # every rank starts from rank 0's weights
            dist.broadcast(p.data, src=0)
        params = [p for p in module.parameters() if p.requires_grad][::-1]
        cap, self.buckets, bucket, size = bucket_cap_mb * 2**20, [], [], 0
        for p in params:
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.pending = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self.launched: list = [None] * len(self.buckets)  # (Work, flat gradients) once a bucket is launched

        def launch(i: int) -> None:
            grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.buckets[i]]
            flat = torch.cat(grads)
            self.launched[i] = (dist.all_reduce(flat, async_op=True), flat)

        def ready(p: torch.Tensor) -> None:
            i = bucket_of[p]
            self.pending[i] -= 1
            if self.pending[i] == 0:  # the bucket's last gradient: communicate now, while the backward goes on
                launch(i)

        self.launch = launch
        for p in params:
            p.register_post_accumulate_grad_hook(ready)
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce; leave the mean gradient in each parameter's ``.grad``."""
        ### BEGIN SOLUTION
        for i, launched in enumerate(self.launched):
            if launched is None:  # a bucket holding a parameter the forward did not use
                self.launch(i)
        world = dist.get_world_size()
        for bucket, (work, flat) in zip(self.buckets, self.launched):
            work.wait()
            for p, mean in zip(bucket, (flat / world).split([p.numel() for p in bucket])):
                if p.grad is not None:
                    p.grad.copy_(mean.view_as(p))
        self.pending = [len(b) for b in self.buckets]  # ready for the next backward
        self.launched = [None] * len(self.buckets)
        ### END SOLUTION
