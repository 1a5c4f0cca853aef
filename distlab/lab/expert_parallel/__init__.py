"""Expert parallelism (notebook 11): a mixture-of-experts FFN layer in one process (``moe``: the
router, capacity, the load-balancing loss; ``balance``: DeepSeek's bias balancing and shared experts;
``dropless``: every slot computed, the experts as one grouped GEMM), GShard's padded all-to-all
dispatch over ranks (``dispatch``), expert parallelism carved from the data-parallel ranks of a mesh
(``mesh``) and the all-to-all's time against routing imbalance (``imbalance``). Exercise 11's uneven
dispatch and inverse permutation are not here."""
from .balance import (DEEPSEEK_V3, BiasRouter, MoEConfig, SharedExpertMoE, router_training, update_bias,
                      with_bias_router)
from .dispatch import ep_job, exchange_counts, expert_parallel_forward, padded_dispatch, run_ep_job
from .dropless import dropless_forward, grouped_mm_works
from .moe import (MoE, MoEOutput, Router, Routing, Slots, assign, capacity, expert_mlp, load_balancing_loss,
                  seeded_moe, tokens_per_expert)

__all__ = ["DEEPSEEK_V3", "BiasRouter", "MoE", "MoEConfig", "MoEOutput", "Router", "Routing", "SharedExpertMoE",
           "Slots", "assign", "capacity", "dropless_forward", "ep_job", "exchange_counts", "expert_mlp",
           "expert_parallel_forward", "grouped_mm_works", "load_balancing_loss", "padded_dispatch",
           "router_training", "run_ep_job", "seeded_moe", "tokens_per_expert", "update_bias", "with_bias_router"]
