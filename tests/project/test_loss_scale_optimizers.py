"""Notebook 02's claim about a forgotten 1/k: under SGD a k-times larger learning rate, under Adam
almost nothing, until gradient clipping, whose threshold then sees k-times larger norms."""
import torch


def _train(optimizer: str, scale: float, clip: float | None = None, steps: int = 5) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8))
    opt = torch.optim.SGD([w], lr=0.01) if optimizer == "sgd" else torch.optim.Adam([w], lr=0.01)
    targets = torch.randn(steps, 8, generator=torch.Generator().manual_seed(1)) * torch.arange(1, steps + 1)[:, None]
    for t in targets:
        opt.zero_grad()
        (scale * ((w - t) ** 2).sum()).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([w], clip)
        opt.step()
    return w.detach()


def test_a_k_times_larger_gradient_under_sgd_adam_and_adam_with_clipping():
    k = 4.0
    start = _train("sgd", 1.0, steps=0)
    sgd_step = _train("sgd", 1.0, steps=1) - start
    assert torch.allclose(_train("sgd", k, steps=1) - start, k * sgd_step, atol=1e-6)  # the learning rate times k
    assert torch.allclose(_train("adam", k), _train("adam", 1.0), atol=1e-6)  # scale-invariant but for eps
    clipped, right = _train("adam", k, clip=20.0), _train("adam", 1.0, clip=20.0)
    assert (clipped - right).abs().max() > 1e-3  # clipping now fires on other steps: a different run
