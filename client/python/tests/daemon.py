"""The real gpujobd for the client's tests: started on the CPU backend on a free port (and a
Unix socket), with a temporary state directory and the test-only ops, its log kept for a
failure's report. GPUJOBD_BIN names the daemon; the process itself is tests/e2e's
GpujobdProcess, which the CTest entry puts on PYTHONPATH."""

import os
import shutil
import subprocess
import tempfile

from gpujobd_process import GpujobdProcess

START_TIMEOUT_S = 30


class Daemon(GpujobdProcess):
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
        argv = [self.binary, "--config", config_path, "--listen", "127.0.0.1:0", "--state-dir",
                self.state_dir, "--backend", "cpu", "--log-level", "info", "--unix-socket",
                self.unix_path, "--set", "debug.test_ops=true"]
        super().__init__(argv, START_TIMEOUT_S)

    @property
    def url(self):
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def token_create(self, user):
        """A token for user made by the admin's `gpujobd token create`: its text."""
        out = subprocess.run([self.binary, "token", "create", "--user", user, "--name", "py",
                              "--state-dir", self.state_dir], check=True, capture_output=True,
                             text=True)
        return out.stdout.strip()

    def stop(self, timeout=30):
        super().stop(timeout)
        shutil.rmtree(self.dir, ignore_errors=True)
