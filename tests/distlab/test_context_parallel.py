"""Context parallelism as notebook 10 teaches it (distlab.lab.context_parallel).

The unit tests check the sharding arithmetic and the log-sum-exp merge in one process. The ring itself at
4 ranks (forward and its hand-written backward against SDPA and autograd on the whole sequence, and the
sends it made) rides in tests/distlab/test_planner.py's one launch of the labs' rank programs, which prices it too.
"""
import torch
import torch.nn.functional as F

from distlab.lab.context_parallel.ring import block_attention, merge
from distlab.lab.context_parallel.sharding import imbalance, positions, shard, unshard, work_per_rank


def test_layouts_cover_the_sequence_once_and_unshard_inverts_shard():
    x = torch.randn(1, 2, 32, 4)
    for layout in ("contiguous", "zigzag"):
        pos = [positions(layout, 32, 4, r) for r in range(4)]
        assert sorted(torch.cat(pos).tolist()) == list(range(32))
        assert torch.equal(unshard([shard(x, p) for p in pos], pos), x)
    assert positions("zigzag", 16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]


def test_zigzag_balances_the_causal_work_and_contiguous_does_not():
    for world in (2, 4, 8):
        seq = 64 * world
        contiguous, zigzag = work_per_rank("contiguous", seq, world), work_per_rank("zigzag", seq, world)
        assert sum(w["pairs"] for w in contiguous) == sum(w["pairs"] for w in zigzag) == seq * (seq + 1) // 2
        assert imbalance(zigzag) == 1.0 and imbalance(zigzag, "blocks") == 1.0
        assert [w["pairs"] for w in contiguous] == sorted(w["pairs"] for w in contiguous)  # the last rank: most
        # contiguous: rank r has r whole shards before it and its own triangle, n^2 (r + 1/2) pairs, so the
        # last rank does about (W - 1/2) / (W / 2) = 2 - 1/W times the mean
        assert abs(imbalance(contiguous) - (2 - 1 / world)) < 0.01


def test_blocks_merged_by_their_log_sum_exp_are_the_softmax_over_all_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    oa, la = block_attention(q, k[..., :3, :], v[..., :3, :])
    ob, lb = block_attention(q, k[..., 3:, :], v[..., 3:, :])
    out, lse = merge(oa, la, ob, lb)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-1, -2) / 2, -1, keepdim=True))
    # a row whose keys are all masked has lse -inf and output 0: merged, it weighs nothing
    o, lse_masked = block_attention(q, k, v, torch.zeros(8, 8, dtype=torch.bool))
    assert torch.isinf(lse_masked).all() and not o.any()
    torch.testing.assert_close(merge(oa, la, o[..., :, :], lse_masked)[0], oa)
