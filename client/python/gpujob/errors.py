"""The exceptions of the client: one per kind of refusal the API gives, each carrying the
answer's HTTP status and its error object's code, message and field."""


class GpujobError(Exception):
    """An error answer of the daemon, or a failure to reach it (status None).

    status: the HTTP status (None when no answer came); code: the API's error code
    ("invalid_argument", "not_found", ...); field: the offending input's path
    ("inputs.x.dtype", "query.limit") or None; retry_after: the Retry-After header's seconds
    where the answer carries one, else None; reset_at: when a spent GPU-time budget resets
    (budget_exceeded: an RFC 3339 time, UTC), else None."""

    def __init__(self, message, status=None, code=None, field=None, retry_after=None,
                 reset_at=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.retry_after = retry_after
        self.reset_at = reset_at

    def __str__(self):
        where = f" (field {self.field})" if self.field else ""
        head = f"{self.status} {self.code}: " if self.status else ""
        return f"{head}{self.message}{where}"


class ConnectionFailed(GpujobError):
    """The daemon could not be reached, or the connection broke before an answer."""


class BadRequest(GpujobError):
    """400: invalid input; field names it."""


class Unauthorized(GpujobError):
    """401: no credentials, or a token that is malformed, unknown, revoked or expired."""


class Forbidden(GpujobError):
    """403: an admin route, another user's data, or a token asked for over TCP."""


class NotFound(GpujobError):
    """404: no such job, buffer, output or token (or another owner's)."""


class Conflict(GpujobError):
    """409: the wrong state (cancelling a final job, the output of a job that did not succeed)."""


class Expired(GpujobError):
    """410: the output's bytes were expired early by the store's bound."""


class PayloadTooLarge(GpujobError):
    """413: a body, tensor, list or quota over its limit."""


class UnsupportedMediaType(GpujobError):
    """415: a Content-Type the route does not take."""


class Unprocessable(GpujobError):
    """422: an op the daemon's backend cannot run, or a usage range with too many rows."""


class TooManyRequests(GpujobError):
    """429: over a per-user limit; retry after retry_after seconds. A spent GPU-time budget
    (code budget_exceeded, field its key) says in reset_at when its UTC day or month resets."""


class Unavailable(GpujobError):
    """503: the daemon is draining, not ready, or busy parsing large bodies."""


class InsufficientStorage(GpujobError):
    """507: the daemon's disk has no room."""


class JobFailed(GpujobError):
    """A job ended failed or cancelled when its outputs were asked for; code and message are the
    job's error (code "cancelled" for a cancelled job), job the Job itself."""

    def __init__(self, job):
        err = job.error or {}
        code = err.get("code", job.state)
        super().__init__(err.get("message", f"job {job.id} {job.state}"), code=code)
        self.job = job


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Expired,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: Unprocessable,
    429: TooManyRequests,
    503: Unavailable,
    507: InsufficientStorage,
}


def error_for(status, body, retry_after=None):
    """The exception for an error answer: its class by status, its fields from the body's
    {"error": {...}} object (a body that is not one gives the status's code "http_STATUS")."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"code": f"http_{status}", "message": f"HTTP {status} without an error object"}
    cls = _BY_STATUS.get(status, GpujobError)
    return cls(str(err.get("message", "")), status=status, code=err.get("code"),
               field=err.get("field"), retry_after=retry_after, reset_at=err.get("reset_at"))
