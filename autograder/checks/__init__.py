"""One module per exercise, ``exNN_<name>.py``, each of the shape described in ``README.md``."""
