"""The notebooks' labs: what each notebook runs and measures, built from the instruments of
:mod:`distlab.measure` and launched by :mod:`distlab.runtime`.

One module per topic (``accumulation``, ``training_memory``, ``fsdp_memory``, ``activation_memory``, ``bandwidth``,
``mfu``, ``recompute``, ``tensor_parallel``, ``ddp_overlap``, ``hang``, ``comm_volume``,
``launching``, ``pipeline/``...), the jobs they launch (``comm_job``, ``examples``), and nothing the
grader's answers could be imported from: a lab stops short of the exercises.
"""
