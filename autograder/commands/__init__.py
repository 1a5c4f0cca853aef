"""The commands: grade, class, selftest, stubs, nbgrader and check(N)."""
