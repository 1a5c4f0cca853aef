"""The tiny transformer (distlab.transformer): seeded, causal, and its attention is SDPA's. No launch."""
import torch

from distlab.transformer import Attention, make_transformer, next_token_loss


def test_seeded_constructor_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    a, b, c = make_transformer(1), make_transformer(1), make_transformer(2)
    assert torch.equal(torch.rand(1), before)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_causal_a_later_token_does_not_change_earlier_logits():
    model = make_transformer(0)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 64
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_attention_is_scaled_dot_product_attention_written_out():
    torch.manual_seed(0)
    attn, x = Attention(32, 4), torch.randn(2, 8, 32)
    q, k, v = attn.heads(x)
    scores = q @ k.transpose(-1, -2) / 8 ** 0.5
    scores = scores.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
    by_hand = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attn(x), by_hand)
    assert q.shape == (2, 4, 8, 8)


def test_one_step_trains_and_every_parameter_gets_a_gradient():
    model = make_transformer(0)
    tokens = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    first = next_token_loss(model, tokens)
    first.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    opt.step()
    assert next_token_loss(model, tokens) < first
    # an untrained model is about uniform over the 64 tokens: a loss near ln 64
    assert abs(first.item() - torch.log(torch.tensor(64.0)).item()) < 1.0



def test_attention_with_its_heads_split_sums_to_the_unsplit_block():
    """No launch: a world of 2 simulated in one process. Each "rank" computes its heads' partial output
    (the all-reduce replaced by collecting the partials), and the partials add up to the unsplit block;
    notebook 08 runs the same function on 2 real ranks and counts its one all-reduce."""
    from unittest import mock

    import torch.distributed as dist

    from distlab.lab.tensor_parallel import attention_heads_split, seeded

    attn, x = seeded(Attention, 0, 32, 4), torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    partials = []
    for rank in range(2):
        with mock.patch.object(dist, "get_world_size", lambda group=None: 2), \
                mock.patch.object(dist, "get_rank", lambda group=None, r=rank: r), \
                mock.patch.object(dist, "all_reduce", lambda t, group=None: None), torch.no_grad():
            partials.append(attention_heads_split(attn, x, group=None))
    with torch.no_grad():
        torch.testing.assert_close(partials[0] + partials[1], attn(x))
    assert not torch.allclose(partials[0], attn(x), atol=1e-3)
