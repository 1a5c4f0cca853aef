"""One module per exercise: ``exNN_<name>.py`` with ``EXERCISE`` and ``grade(path)``."""
