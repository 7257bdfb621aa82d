"""Python runs this at start-up in every process ``cclctl run`` starts (it is first on
PYTHONPATH): torch.distributed gets instrumented when torch is imported, without a change to
the training script. The ``sitecustomize`` this one shadows, if any, runs afterwards.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _arm() -> None:
    try:
        from cclctl.integrations.torch.boot import arm

        arm()
    except Exception as exc:  # the job must start whatever happens here
        print(f"cclctl run: torch.distributed is not instrumented: {exc}", file=sys.stderr)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path (a distribution's or a virtualenv's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_arm()
_chain()
