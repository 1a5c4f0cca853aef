"""The old name of ``python -m autograder.nbgrader STEP``, kept for instructors' scripts and habits.

``python -m autograder.nbgrader.course STEP [options]`` runs the same command
line (:mod:`autograder.nbgrader.course`).
"""
import sys

from .nbgrader.course import COURSE_DIR, STEPS, Course, main

__all__ = ["COURSE_DIR", "STEPS", "Course", "main"]

if __name__ == "__main__":
    sys.exit(main())
