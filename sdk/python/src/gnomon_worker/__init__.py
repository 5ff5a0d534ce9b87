"""gnomon-worker: run gnomon ``handler`` jobs in a Python process.

>>> from gnomon_worker import Worker
>>> worker = Worker(servers=["127.0.0.1:7400"])
>>> @worker.handler("resize")
... def resize(ctx):
...     ctx.log.info("resizing %s", ctx.params["image"])
...     return "done"
>>> worker.run()  # doctest: +SKIP
"""

from .config import Tls
from .context import AttemptLog, Context
from .errors import NonRetryable, RetryAfter
from .fence import Fence, FenceRejected, LockTimeout, NotInTransaction, Step, Superseded
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AttemptLog",
    "Context",
    "Fence",
    "FenceRejected",
    "LockTimeout",
    "NonRetryable",
    "NotInTransaction",
    "RetryAfter",
    "Step",
    "Superseded",
    "Tls",
    "Worker",
    "__version__",
]
