"""The import path of every notebook released to learners: ``from autograder.nbgrader_cell import grade``.

The test cell of each assignment's notebook runs ``grade(N)`` from here, and so
do the notebooks already in learners' hands (and in the gradebook, which
restores the test cells at autograding); ``course/02_gradient_accumulation.py``
imports ``stubs_left``. So this name stays, as a re-export: the code is in
:mod:`autograder.nbgrader.cell`.
"""
from .nbgrader.cell import fresh_grader_source, grade, stderr_to_stdout, stubs_left

__all__ = ["fresh_grader_source", "grade", "stderr_to_stdout", "stubs_left"]
