# Not a kernel: a probe that reports how it was loaded by raising at import (the message comes back in the verdict's
# detail through both the numeric harness and the end-to-end engine). Used by tests/gate/test_gate_loader.py only; it
# never goes through the static stage.
import hashlib
import os
import sys

_SEEN = repr((__name__, os.path.basename(__file__), list(sys.argv), sorted(os.environ)))
raise RuntimeError(f"probe {hashlib.sha256(_SEEN.encode()).hexdigest()[:16]} {__name__} "
                   f"{os.path.basename(__file__)} {sys.argv!r} {len(os.environ)}")
