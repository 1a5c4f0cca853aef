"""Grading the course with nbgrader: one assignment per exercise, graded by the CLI's own checks.

``python -m autograder.nbgrader STEP`` runs the instructor's cycle (:mod:`.course`).
The modules, one concern each:

* :mod:`.assignments`  each exercise's assignment (notebook and module) from the registry and ``solutions/``
* :mod:`.cell`         what a notebook's test cell runs (``autograder.nbgrader_cell`` re-exports it)
* :mod:`.repair`       broken submissions made gradable before autograde, with a note for each problem
* :mod:`.verify`       the scores checked outside the learner's kernel after autograde
* :mod:`.course`       the steps and the command line

The class's data (the nbgrader course directory) is not in this package: it is
the repository's top-level ``nbgrader/`` folder, where only ``nbgrader_config.py``
is in git.
"""
