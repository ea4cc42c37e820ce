"""The real gpujobd for the client's tests: started on the CPU backend on a free port (and a
Unix socket), with a temporary state directory and the test-only ops, its log kept for a
failure's report. GPUJOBD_BIN names the daemon."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading

START_TIMEOUT_S = 30


def _die_with_parent():
    """Runs in the child before exec: the daemon must not outlive a test that crashed."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Daemon:
    def __init__(self, config="", workdir=None):
        """config: the daemon's configuration file's text; workdir: a directory of the test's
        to run in (files the config names may live there), else a fresh one."""
        self.binary = os.environ["GPUJOBD_BIN"]
        self.dir = workdir or tempfile.mkdtemp(prefix="gpujob-py-")
        self.state_dir = os.path.join(self.dir, "state")
        os.mkdir(self.state_dir)
        self.unix_path = os.path.join(self.dir, "gpujobd.sock")
        config_path = os.path.join(self.dir, "gpujobd.conf")
        with open(config_path, "w", encoding="utf-8") as f:
            f.write(config)
        self.log = []
        self.port = None
        self.scheme = "http"
        self.listening = threading.Event()
        argv = [self.binary, "--config", config_path, "--listen", "127.0.0.1:0", "--state-dir",
                self.state_dir, "--backend", "cpu", "--log-level", "info", "--unix-socket",
                self.unix_path, "--set", "debug.test_ops=true"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        self.reader = threading.Thread(target=self._read_log, daemon=True)
        self.reader.start()
        if not self.listening.wait(START_TIMEOUT_S) or self.port is None:
            self.stop()
            raise RuntimeError("gpujobd did not start:\n" + self.log_text())

    def _read_log(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(line)
            m = re.search(r"listening on (https?)://(\S+):(\d+)", line)
            if m and not self.listening.is_set():
                self.scheme, self.port = m.group(1), int(m.group(3))
                self.listening.set()
        self.listening.set()

    @property
    def url(self):
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def log_text(self):
        return "\n".join(self.log[-60:])

    def token_create(self, user):
        """A token for user made by the admin's `gpujobd token create`: its text."""
        out = subprocess.run([self.binary, "token", "create", "--user", user, "--name", "py",
                              "--state-dir", self.state_dir], check=True, capture_output=True,
                             text=True)
        return out.stdout.strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(10)
        self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)
