"""The process runtime: launching ranks and ending every process they start.

``launch`` (:func:`distlab.torchrun`: one launcher, torchrun's engine, warm or as the CLI),
``warm``/``forkserver``/``agent`` (launches forked from a server that imported torch once),
``worker`` (what runs in each rank), ``costs`` (what each launch cost, for ``make bench``),
``process`` and ``reaper`` (the one supervisor: limits, tags, a subreaper that ends what a job
leaves), ``heartbeat`` (whether ranks advance), ``sandbox`` (the learner's user and rlimits),
``multinode`` (several agents, one rendezvous), ``distributed`` (``init_distributed`` and the
backend choice), ``importing``, ``magic``.

This layer imports nothing from :mod:`distlab.measure` or :mod:`distlab.lab`
(``tests/project/test_layout.py``): what runs the learner's code must not depend on what measures it.
"""
