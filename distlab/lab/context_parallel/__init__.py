"""Notebook 10's context parallelism: the sequence split across ranks.

``sharding`` (which positions each rank holds: contiguous, or zig-zag for causal balance, and the score
blocks each rank computes), ``ring`` (ring attention by hand with ``dist.batch_isend_irecv``, non-causal,
forward only), ``jobs`` (what the notebook launches: parity, work per rank, memory, bytes sent),
``allgather`` (Llama 3's all-gather variant beside the ring, and the weights' gradients summed over the CP
group).
The ring's backward, and the causal ring on the zig-zag layout, are exercise 10's: nothing here answers them.
"""
