"""The commands: grade, class, selftest, stubs, nbgrader, gradescope and check(N)."""
