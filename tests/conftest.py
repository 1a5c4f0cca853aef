import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Every process this test session starts inherits this marker, so "nothing was left
# behind" can be checked without mistaking someone else's processes for ours.
os.environ["DISTLAB_TEST_SESSION"] = SESSION = uuid.uuid4().hex
