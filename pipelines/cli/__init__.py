"""`lakehouse`: the operator's commands (`app.main`), each layer's beside its code and gathered here.

`python -m pipelines.cli` and an EMR step's `cli.py` (this package's `__main__.py`) run the same group.
"""

from pipelines.cli.app import main

__all__ = ["main"]
