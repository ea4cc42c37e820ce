"""HTTP to the daemon with the standard library: one kept-alive connection per Client, over
TCP, TLS or the daemon's Unix socket, found as the C client finds it ($GPUJOB_URL, else the
packaged daemon's socket)."""

import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse

from .errors import ConnectionFailed, GpujobError, error_for

DEFAULT_SOCKET = "/run/gpujobd/gpujobd.sock"
USER_AGENT = "gpujob-python/0.1.0"


class Answer:
    """One answer: status, lower-cased headers and the body's bytes."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def media_type(self):
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    def json(self):
        """The body as JSON; a framed answer's JSON is its first Gpujob-Json-Length bytes."""
        n = self.json_length()
        try:
            return json.loads(self.body[:n] if n is not None else self.body)
        except ValueError as e:
            raise GpujobError(f"the daemon's answer is not JSON: {e}", status=self.status) from e

    def json_length(self):
        value = self.headers.get("gpujob-json-length")
        if value is None or self.media_type() != "application/octet-stream":
            return None
        if not value.isdigit() or int(value) > len(self.body):
            raise GpujobError(f"bad Gpujob-Json-Length '{value}'", status=self.status)
        return int(value)

    def section(self):
        """The binary section of a framed answer (empty for a JSON one)."""
        n = self.json_length()
        return memoryview(self.body)[n:] if n is not None else memoryview(b"")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


def parse_address(address):
    """("unix", path) or (scheme, host, port) for an address: "unix:/path", an absolute path,
    or an http:// or https:// URL without a query. None means $GPUJOB_URL, else the default
    socket."""
    if not address:
        address = os.environ.get("GPUJOB_URL") or DEFAULT_SOCKET
    if address.startswith("unix:") or address.startswith("/"):
        path = address[5:] if address.startswith("unix:") else address
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ValueError(f"Unix socket path '{path}' is not absolute")
        return ("unix", path)
    url = urllib.parse.urlsplit(address)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"address '{address}' is neither an http(s):// URL nor a Unix socket "
                         "path (unix:/PATH)")
    if url.query or url.fragment or url.path.strip("/"):
        raise ValueError(f"URL '{address}' must be only scheme, host and port")
    return (url.scheme, url.hostname, url.port or (443 if url.scheme == "https" else 80))


def check_token(token):
    """The token, refused (without quoting it) when it could not travel in a header."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in token):
        raise ValueError("the token holds a space or control character")
    return token


class Transport:
    """Sends requests on one connection, kept alive and reopened when the daemon closed it.
    Requests are serialised by a lock, so one Client may be shared by threads (each request
    then waits for the one before it)."""

    def __init__(self, address, token, ca_file, timeout):
        self.target = parse_address(address)
        self.token = check_token(token) if token else None
        self.timeout = timeout
        self.ssl_context = None
        if self.target[0] == "https":
            self.ssl_context = ssl.create_default_context(cafile=ca_file)
        self.conn = None
        self.lock = threading.Lock()

    def describe(self):
        if self.target[0] == "unix":
            return f"unix:{self.target[1]}"
        return f"{self.target[0]}://{self.target[1]}:{self.target[2]}"

    def _open(self, timeout):
        kind = self.target[0]
        if kind == "unix":
            return _UnixConnection(self.target[1], timeout)
        if kind == "https":
            return http.client.HTTPSConnection(self.target[1], self.target[2], timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(self.target[1], self.target[2], timeout=timeout)

    def close(self):
        with self.lock:
            if self.conn:
                self.conn.close()
                self.conn = None

    def request(self, method, path, body=None, headers=None, timeout=None):
        """The Answer to one request; raises the error's exception for a status of 400 or more,
        ConnectionFailed when no answer came. A kept-alive connection the daemon closed
        meanwhile is reopened and the request sent again, once: it never reached the daemon
        (a body read from a file is not sent twice: that error is raised instead)."""
        send = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if self.token:
            send["Authorization"] = f"Bearer {self.token}"
        send.update(headers or {})
        with self.lock:
            for attempt in (0, 1):
                reused = self.conn is not None
                if not reused:
                    self.conn = self._open(timeout or self.timeout)
                elif self.conn.sock is not None:
                    self.conn.sock.settimeout(timeout or self.timeout)
                try:
                    self.conn.request(method, path, body=body, headers=send)
                    resp = self.conn.getresponse()
                    answer = Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                    resp.read())
                    if resp.will_close:
                        self.conn.close()
                        self.conn = None
                    break
                except (http.client.RemoteDisconnected, ConnectionResetError,
                        BrokenPipeError) as e:
                    self.conn.close()
                    self.conn = None
                    if reused and attempt == 0 and not hasattr(body, "read"):
                        continue
                    raise ConnectionFailed(f"{self.describe()}: {e}") from e
                except (OSError, http.client.HTTPException) as e:
                    self.conn.close()
                    self.conn = None
                    raise ConnectionFailed(f"cannot reach gpujobd at {self.describe()}: {e}") from e
        if answer.status >= 400:
            retry = answer.headers.get("retry-after")
            try:
                body = json.loads(answer.body) if answer.media_type() == "application/json" else None
            except ValueError:
                body = None
            raise error_for(answer.status, body, int(retry) if retry and retry.isdigit() else None)
        return answer
