"""The autograder: python -m autograder, or autograder.check(N) from a notebook."""
