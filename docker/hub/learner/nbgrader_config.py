"""nbgrader's configuration in a learner's server on the class's JupyterHub (docker/hub/jupyterhub_config.py
puts this folder first on the learner's JUPYTER_CONFIG_PATH).

The exchange: nbgrader 0.9.6's default root is /usr/local/share/nbgrader/exchange, not the hub's. The size
limit: nbgrader checks it in the learner's own process, before it copies (``Directory size is too big``), so
an ordinary submit over it fails at once with that message; docker/hub/seal_exchange.py checks it again
where the learner cannot change it.
"""
import os

c = get_config()  # noqa: F821  (nbgrader provides it when it loads this file)
c.Exchange.root = os.environ.get("DISTLAB_EXCHANGE", "/srv/nbgrader/exchange")
c.CourseDirectory.max_dir_size = int(os.environ.get("DISTLAB_HUB_MAX_SUBMISSION_KB", "5000"))  # kB of 1000 bytes
c.CourseDirectory.max_file_size = c.CourseDirectory.max_dir_size
