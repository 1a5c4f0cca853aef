"""distlab.measure.ddp_hooks.BucketLog: what it records of DDP's buckets, and that it reduces them as DDP does.

No launch: a one-rank gloo group in this process (a ``HashStore``, no port). DDP's reducer runs
its buckets and the hook at any world size; at world 1 the all-reduce is the identity after
``allreduce_hook``'s division by 1, so the gradients must equal the model's own.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab.data import seeded_batch
from distlab.measure.ddp_hooks import BucketLog


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def _step(model, x, y) -> None:
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()


def test_every_bucket_of_every_round_is_recorded_and_reduced_as_ddp_does(group):
    x, y = seeded_batch(8, 64, 10, seed=1)
    plain, model = _model(), _model()
    ddp = DDP(model, bucket_cap_mb=0.1)  # 100 KB buckets: the 256x256 layer (256 KB) closes one alone
    log = BucketLog().register(ddp)
    for _ in range(3):  # round 0: one bucket (DDP does not know the order yet); then rebuilt
        _step(ddp, x, y)
    _step(plain, x, y)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert log.rounds == 3
    per_round = log.bytes_per_round()
    assert [sum(r) for r in per_round] == [grad_bytes] * 3  # every gradient once a round
    assert len(per_round[0]) == 1 and len(per_round[2]) >= 2
    assert [b.index for b in log.in_round(-1)] == list(range(len(per_round[2])))
    assert log.total_bytes() == 3 * grad_bytes
    times = [b.time for b in log.buckets]
    assert times == sorted(times)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


def test_no_sync_hands_over_no_bucket(group):
    x, y = seeded_batch(8, 64, 10, seed=2)
    ddp = DDP(_model())
    log = BucketLog().register(ddp)
    with ddp.no_sync():
        _step(ddp, x, y)
    assert log.rounds == 0 and log.buckets == []
    nn.functional.cross_entropy(ddp(x), y).backward()  # accumulates, then synchronises: one round
    assert log.rounds == 1
