"""gpujobd as a child process of the Python tests (the e2e ones here and client/python's, whose
CTest entry puts this folder on PYTHONPATH): started with its argv, its output kept for the
failure report, its scheme and TCP port read from the line that says where it listens."""
import re
import signal
import subprocess
import threading


def die_with_parent():
    """Runs in the child before exec: the daemon must not outlive a test that crashed."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class GpujobdProcess:
    """Starts gpujobd with argv (which should pass --listen HOST:0) and waits, up to
    start_timeout_s, for "listening on http(s)://HOST:PORT"; raises RuntimeError with the log
    when it does not come."""

    def __init__(self, argv, start_timeout_s):
        self.log = []
        self.port = None
        self.scheme = "http"
        self.listening = threading.Event()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_parent)
        self.reader = threading.Thread(target=self._read_log, daemon=True)
        self.reader.start()
        if not self.listening.wait(start_timeout_s) or self.port is None:
            self.kill()
            raise RuntimeError(f"gpujobd did not report listening within {start_timeout_s} s:\n"
                               + self.log_text())

    def _read_log(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(line)
            m = re.search(r"listening on (https?)://(\S+):(\d+)", line)
            if m and not self.listening.is_set():
                self.scheme, self.port = m.group(1), int(m.group(3))
                self.listening.set()
        self.listening.set()  # EOF: wake the waiter, which then finds no port

    def log_text(self, lines=60):
        return "\n".join(self.log[-lines:])

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """The exit status, or None while it still runs after timeout seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=30):
        """SIGTERM (the daemon drains and exits), SIGKILL after timeout seconds; then the log
        reader is done and every line is in self.log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            if self.wait(timeout) is None:
                self.kill()
        self.reader.join(10)
        self.proc.stdout.close()
