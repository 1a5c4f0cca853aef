"""``python -m autograder.nbgrader STEP [options]``: the nbgrader cycle (see :mod:`autograder.nbgrader.course`)."""
import sys

from .course import main

sys.exit(main())
