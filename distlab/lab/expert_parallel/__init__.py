"""Expert parallelism (notebook 11): a mixture-of-experts FFN layer in one process (``moe``: the
router, capacity, the load-balancing loss) and GShard's padded all-to-all dispatch over ranks
(``dispatch``). Exercise 11's uneven dispatch and inverse permutation are not here."""
from .dispatch import ep_job, exchange_counts, expert_parallel_forward, padded_dispatch, run_ep_job
from .moe import (MoE, MoEOutput, Router, Routing, Slots, assign, capacity, expert_mlp, load_balancing_loss,
                  seeded_moe, tokens_per_expert)

__all__ = ["MoE", "MoEOutput", "Router", "Routing", "Slots", "assign", "capacity", "ep_job", "exchange_counts",
           "expert_mlp", "expert_parallel_forward", "load_balancing_loss", "padded_dispatch", "run_ep_job",
           "seeded_moe", "tokens_per_expert"]
