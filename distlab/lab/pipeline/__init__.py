"""Notebook 07's pipeline parallelism: ``timeline`` (schedules, bubbles and Gantt charts),
``run`` (``torch.distributed.pipelining``'s schedules run and timed, parity-checked),
``costs`` (per-message cost and saved bytes), ``sweep`` (the workloads and one launch for all)."""
