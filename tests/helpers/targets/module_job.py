"""A ``python -m`` program for :func:`distlab.runtime.warm.run_module`'s tests: what it does is its first argument.

``view``: print one JSON line (whether torch was already imported when this module started, its argv,
its working folder, a variable of the job's environment) and exit 0; ``exit N``: ``sys.exit(N)``;
``raise``: raise a ``ValueError``; ``hang PIDFILE``: start a child that ignores SIGTERM, write both pids,
and sleep.
"""
import json
import os
import subprocess
import sys
import time

WARM = "torch" in sys.modules  # imported by the server this process was forked from

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "view":
        print(json.dumps({"warm": WARM, "argv": sys.argv[1:], "cwd": os.getcwd(),
                          "var": os.environ.get("DISTLAB_TEST_VAR")}), flush=True)
    elif what == "exit":
        sys.exit(int(sys.argv[2]))
    elif what == "raise":
        raise ValueError("the module raised")
    elif what == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); time.sleep(600)"], start_new_session=True)
        with open(sys.argv[2], "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        time.sleep(600)
