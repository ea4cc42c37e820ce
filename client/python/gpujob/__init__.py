"""gpujob: the Python client of gpujobd. NumPy arrays go in and come out raw through the
API's binary section; errors are exceptions that carry the API's status, code and field.

    import numpy as np, gpujob
    with gpujob.Client("http://127.0.0.1:8080") as c:
        out = c.run("add", {"x": np.ones(4, np.float32), "y": np.ones(4, np.float32)})["out"]
"""

from .client import Buffer, Client, Job
from .errors import (BadRequest, Conflict, ConnectionFailed, Expired, Forbidden, GpujobError,
                     InsufficientStorage, JobFailed, NotFound, PayloadTooLarge, TooManyRequests,
                     Unauthorized, Unavailable, UnsupportedMediaType, Unprocessable)
from .tensors import DTYPES, dtype_name

__version__ = "0.1.0"
__all__ = [
    "Client", "Job", "Buffer", "DTYPES", "dtype_name", "GpujobError", "ConnectionFailed",
    "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "Expired",
    "PayloadTooLarge", "UnsupportedMediaType", "Unprocessable", "TooManyRequests",
    "Unavailable", "InsufficientStorage", "JobFailed",
]
