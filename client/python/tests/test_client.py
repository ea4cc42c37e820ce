"""The gpujob package against the real gpujobd (CPU backend): every call of the Client, NumPy
results equal to a reference computed with NumPy, every error answer mapped to its exception
with the API's code and field, the Unix socket, tokens, HTTPS with a CA file, a connection the
daemon closed reopened, and a pip install of the package.

Run by CTest (test_python_client) with GPUJOBD_BIN set; the package is imported from the
source tree beside this file."""

import contextlib
import io
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is missing; scripts/deps.sh installs it")
    sys.exit(77)

import gpujob  # noqa: E402
from daemon import Daemon  # noqa: E402

# Small limits make 413 cheap to provoke and put outputs past 1 KiB on the download path;
# one CPU worker and one running job per user keep a second job queued behind a slow one.
CONFIG = """\
[limits]
max_jobs_per_request = 8
max_inline_output_bytes = 1KiB
max_tensor_bytes = 4MiB
max_running_per_user = 1
[scheduler]
cpu_threads = 1
"""

# A job that holds the only worker for a while, so that the next one stays queued.
SLOW_MS = 1500

rng = np.random.default_rng(26)


def slow_job(ms=SLOW_MS):
    return {"op": "debug_sleep", "inputs": {"x": np.zeros(1, np.float32)}, "params": {"ms": ms}}


class CommonDaemon(unittest.TestCase):
    """One daemon with the default auth mode (the test's account over loopback) for the tests of
    the calls and their errors."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(CONFIG)
        cls.c = gpujob.Client(cls.daemon.url)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def run(self, result=None):
        """Runs the test; a failure's report ends with the daemon's latest log lines."""
        bad = (lambda r: len(r.failures) + len(r.errors)) if result is not None else None
        before = bad(result) if bad else 0
        outcome = super().run(result)
        if bad and bad(result) > before:
            sys.stderr.write("gpujobd log:\n" + self.daemon.log_text() + "\n")
        return outcome


class TestJobs(CommonDaemon):
    def test_info_and_health_describe_the_daemon(self):
        info = self.c.info()
        self.assertIn("add", [op["name"] for op in info["ops"]])
        self.assertEqual(info["limits"]["max_jobs_per_request"], 8)
        self.assertEqual(self.c.health()["status"], "ready")

    def test_run_results_equal_numpy_for_every_dtype(self):
        for dtype in (np.float32, np.float64, np.float16, np.int32):
            with self.subTest(op="add", dtype=np.dtype(dtype).name):
                x = (rng.random(37) * 50).astype(dtype)
                y = (rng.random(37) * 50).astype(dtype)
                out = self.c.run("add", {"x": x, "y": y})["out"]
                self.assertEqual(out.dtype, np.dtype(dtype))
                np.testing.assert_array_equal(out, x + y)
        for dtype in (np.uint32, np.int64):
            with self.subTest(op="sort", dtype=np.dtype(dtype).name):
                keys = rng.integers(0, 2**31, 41).astype(dtype)
                out = self.c.run("sort", {"keys": keys})["keys"]
                self.assertEqual(out.dtype, np.dtype(dtype))
                np.testing.assert_array_equal(out, np.sort(keys))
        a = rng.integers(-128, 128, (3, 5)).astype(np.int8)
        b = rng.integers(-128, 128, (5, 4)).astype(np.int8)
        out = self.c.run("gemm", {"a": a, "b": b})["out"]
        np.testing.assert_array_equal(out, a.astype(np.int32) @ b.astype(np.int32))

    def test_gemm_saxpy_sum_sort_match_numpy(self):
        a = rng.standard_normal((16, 24), dtype=np.float32)
        b = rng.standard_normal((24, 8), dtype=np.float32)
        out = self.c.run("gemm", {"a": a, "b": b}, {"alpha": 2.0})["out"]
        np.testing.assert_allclose(out, 2.0 * (a @ b), rtol=1e-5, atol=1e-5)
        x = rng.standard_normal(100, dtype=np.float32)
        y = rng.standard_normal(100, dtype=np.float32)
        out = self.c.run("saxpy", {"x": x, "y": y}, {"a": 3.0})["out"]
        np.testing.assert_allclose(out, np.float32(3.0) * x + y, rtol=1e-6)
        out = self.c.run("sum", {"x": x.astype(np.float64)})["out"]
        self.assertEqual(out.shape, ())
        self.assertAlmostEqual(float(out), float(x.astype(np.float64).sum()), places=9)
        keys = rng.integers(-1000, 1000, 50).astype(np.int32)
        sorted_keys = self.c.run("sort", {"keys": keys}, {"descending": True})["keys"]
        np.testing.assert_array_equal(sorted_keys, np.sort(keys)[::-1])

    def test_large_output_is_downloaded_and_equals_numpy(self):
        # 64 KiB of output, past the 1 KiB inline limit: Job.outputs() downloads it raw.
        x = rng.standard_normal((128, 128), dtype=np.float32)
        job = self.c.submit("mul", {"x": x, "y": np.float32(0.5)}, wait=30)
        self.assertEqual(job.state, "succeeded")
        self.assertNotIn("binary_offset", job.raw["outputs"]["out"])
        np.testing.assert_array_equal(job.outputs()["out"], x * np.float32(0.5))
        np.testing.assert_array_equal(self.c.download(job, "out"), x * np.float32(0.5))

    def test_bf16_input_pair_and_output_widened_to_f32(self):
        values = np.array([1.0, -2.5, 3.0, 0.125], np.float32)
        bits = (values.view(np.uint32) >> 16).astype(np.uint16)
        out = self.c.run("add", {"x": (bits, "bf16"), "y": (bits, "bf16")})["out"]
        self.assertEqual(out.dtype, np.float32)
        np.testing.assert_array_equal(out, values * 2)

    def test_submit_then_get_and_wait(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        job = self.c.submit("add", {"x": x, "y": x}, priority=5, idempotency_key="py-get-wait")
        self.assertRegex(job.id, r"^j[0-9a-f]{24}$")
        self.assertIs(job.wait(timeout=30), job)
        self.assertTrue(job.done)
        np.testing.assert_array_equal(job.outputs()["out"], x + x)
        again = self.c.get(job.id)
        self.assertEqual((again.state, again.raw["priority"]), ("succeeded", 5))
        np.testing.assert_array_equal(again.output("out"), x + x)
        by_id = self.c.wait(job.id, timeout=5)
        np.testing.assert_array_equal(by_id.output("out"), x + x)
        retry = self.c.submit("add", {"x": x, "y": x}, idempotency_key="py-get-wait")
        self.assertEqual(retry.id, job.id)

    def test_submit_many_and_wait_all_with_a_progress_bar(self):
        xs = [rng.standard_normal(10, dtype=np.float32) for _ in range(5)]
        jobs = self.c.submit_many([{"op": "mul", "inputs": {"x": x, "y": x}} for x in xs])
        self.assertEqual(len(jobs), 5)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            done = self.c.wait_all(jobs, timeout=60, progress=True)
        self.assertIn("5/5", err.getvalue())
        for x, job in zip(xs, done):
            np.testing.assert_array_equal(job.outputs()["out"], x * x)

    def test_submit_many_with_wait_answers_every_job_ended(self):
        xs = [rng.standard_normal(10, dtype=np.float32) for _ in range(5)]
        jobs = self.c.submit_many([{"op": "mul", "inputs": {"x": x, "y": x}} for x in xs],
                                  wait=30)
        self.assertEqual([j.state for j in jobs], ["succeeded"] * 5)
        for x, job in zip(xs, jobs):
            np.testing.assert_array_equal(job.output("out"), x * x)

    def test_list_filters_by_op_and_state_across_pages(self):
        ids = {j.id for j in self.c.submit_many(
            [{"op": "dot", "inputs": {"x": np.ones(3), "y": np.ones(3)}} for _ in range(3)])}
        self.c.wait_all(list(ids), timeout=60, progress=False)
        listed = list(self.c.list(op="dot", limit=2))
        self.assertTrue(ids <= {j.id for j in listed})
        self.assertTrue(all(j.op == "dot" for j in listed))
        self.assertTrue(all(j.state == "succeeded" for j in self.c.list(state="succeeded")))

    def test_cancel_a_queued_job_and_then_conflict(self):
        slow = self.c.submit(**slow_job())
        queued = self.c.submit(**slow_job())
        queued.cancel()
        self.assertEqual((queued.state, queued.cancel_result), ("cancelled", "dequeued"))
        with self.assertRaises(gpujob.Conflict) as cm:
            self.c.cancel(queued.id)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "conflict"))
        with self.assertRaises(gpujob.JobFailed) as failed:
            queued.outputs()
        self.assertEqual(failed.exception.job, queued)
        self.c.cancel(slow)

    def test_usage_counts_the_jobs_that_ended(self):
        before = self.c.usage()["totals"]["jobs"]
        self.c.run("add", {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})
        usage = self.c.usage(user="*")
        self.assertEqual(usage["owner"], "*")
        self.assertGreater(self.c.usage()["totals"]["jobs"], before)


class TestBuffers(CommonDaemon):
    def test_upload_array_and_npy_as_inputs(self):
        x = rng.standard_normal((4, 5), dtype=np.float32)
        y = rng.standard_normal((4, 5), dtype=np.float32)
        bx = self.c.upload(x)
        self.assertEqual((bx.dtype, bx.shape, bx.nbytes, bx.resident), ("f32", (4, 5), 80, False))
        with tempfile.NamedTemporaryFile(suffix=".npy") as f:
            np.save(f, y)
            f.flush()
            by = self.c.upload(f.name, resident=True)
        self.assertEqual((by.dtype, by.shape, by.resident), ("f32", (4, 5), True))
        out = self.c.run("add", {"x": bx, "y": by.id})["out"]
        np.testing.assert_array_equal(out, x + y)
        self.assertEqual(self.c.buffer(bx.id).shape, (4, 5))

    def test_keep_output_feeds_the_next_job_and_delete_removes_it(self):
        x = np.arange(8, dtype=np.int32)
        job = self.c.submit("add", {"x": x, "y": x}, wait=30)
        kept = job.keep("out", resident=True)
        self.assertEqual((kept.dtype, kept.shape, kept.resident), ("i32", (8,), True))
        out = self.c.run("mul", {"x": kept, "y": x})["out"]
        np.testing.assert_array_equal(out, (x + x) * x)
        kept.delete()
        with self.assertRaises(gpujob.NotFound) as cm:
            self.c.buffer(kept.id)
        self.assertEqual(cm.exception.code, "not_found")


class TestErrors(CommonDaemon):
    def test_bad_param_is_bad_request_with_field(self):
        with self.assertRaises(gpujob.BadRequest) as cm:
            self.c.submit("saxpy", {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})
        e = cm.exception
        self.assertEqual((e.status, e.code, e.field), (400, "invalid_argument", "params.a"))
        self.assertIn("params.a", str(e))

    def test_list_item_error_names_its_index(self):
        jobs = [{"op": "add", "inputs": {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)}},
                {"op": "add", "inputs": {"x": np.ones(2, np.float32), "y": np.ones(3, np.float32)}}]
        with self.assertRaises(gpujob.BadRequest) as cm:
            self.c.submit_many(jobs)
        self.assertTrue(cm.exception.field.startswith("[1].inputs."), cm.exception.field)

    def test_unknown_ids_are_not_found(self):
        with self.assertRaises(gpujob.NotFound) as cm:
            self.c.get("j" + "0" * 24)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(gpujob.NotFound):
            self.c.delete_buffer("b" + "0" * 24)

    def test_too_large_tensor_and_list_are_payload_too_large(self):
        with self.assertRaises(gpujob.PayloadTooLarge) as cm:
            self.c.submit("sum", {"x": np.zeros(2 * 1024 * 1024, np.float32)})
        self.assertEqual((cm.exception.status, cm.exception.code), (413, "payload_too_large"))
        self.assertEqual(cm.exception.field, "inputs.x.shape")
        with self.assertRaises(gpujob.PayloadTooLarge):
            self.c.submit_many([{"op": "sum", "inputs": {"x": np.ones(1)}}] * 9)

    def test_failed_job_raises_job_failed_with_its_code(self):
        job = self.c.submit("debug_fault", {"x": np.ones(1, np.float32)}, wait=30)
        self.assertEqual(job.state, "failed")
        with self.assertRaises(gpujob.JobFailed) as cm:
            job.outputs()
        self.assertEqual(cm.exception.code, job.error["code"])
        with self.assertRaises(gpujob.Conflict):
            self.c.download(job, "out")

    def test_a_job_past_its_time_limit_fails_with_time_limit(self):
        job = self.c.submit("debug_sleep", {"x": np.ones(4, np.float32)}, {"ms": 5000},
                            time_limit_ms=200, wait=30)
        self.assertEqual(job.state, "failed")
        self.assertEqual(job.error["code"], "time_limit")
        self.assertEqual(job.raw["time_limit_ms"], 200)
        with self.assertRaises(gpujob.JobFailed) as cm:
            job.outputs()
        self.assertEqual(cm.exception.code, "time_limit")

    def test_bad_usage_date_names_the_query_field(self):
        with self.assertRaises(gpujob.BadRequest) as cm:
            self.c.usage(since="yesterday")
        self.assertEqual(cm.exception.field, "query.since")

    def test_token_over_tcp_is_forbidden(self):
        with self.assertRaises(gpujob.Forbidden) as cm:
            self.c.create_token("laptop")
        self.assertEqual((cm.exception.status, cm.exception.code), (403, "forbidden"))

    def test_unsupported_dtype_is_refused_before_sending(self):
        with self.assertRaises(ValueError):
            self.c.submit("add", {"x": np.ones(2, np.complex64), "y": np.ones(2, np.complex64)})

    def test_no_daemon_is_connection_failed(self):
        with self.assertRaises(gpujob.ConnectionFailed) as cm:
            gpujob.Client("http://127.0.0.1:9", timeout=5).info()
        self.assertIsNone(cm.exception.status)
        with self.assertRaises(gpujob.ConnectionFailed):
            gpujob.Client("unix:/nonexistent/gpujobd.sock").info()

    def test_bad_addresses_and_tokens_are_value_errors(self):
        for address in ("ftp://host", "unix:relative", "http://host:1/path?q"):
            with self.subTest(address=address), self.assertRaises(ValueError):
                gpujob.Client(address)
        with self.assertRaises(ValueError):
            gpujob.Client(self.daemon.url, token="two words")


class TestAuth(unittest.TestCase):
    """A daemon with tokens over TCP and peer uids over its Unix socket, and a queue limit."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("[auth]\nmode = token,peercred\n[limits]\nmax_queued_per_user = 1\n"
                            "max_running_per_user = 1\n[scheduler]\ncpu_threads = 1\n"
                            "[user.dave]\ngpu_hours_per_day = 0.0001\n")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_unix_socket_user_makes_a_token_that_works_over_tcp(self):
        with gpujob.Client("unix:" + self.daemon.unix_path) as local:
            me = local.info()["user"]["name"]
            made = local.create_token("laptop", expires_in_s=3600)
            self.assertIn(made["id"], [t["id"] for t in local.tokens()])
            with gpujob.Client(self.daemon.url, token=made["token"]) as remote:
                self.assertEqual(remote.info()["user"]["name"], me)
                local.revoke_token(made["id"])
                with self.assertRaises(gpujob.Unauthorized):
                    remote.info()

    def test_tcp_is_the_loopback_account_or_a_token_from_the_environment(self):
        # Without a token, a client on this host is its own account, as the kernel names it.
        with gpujob.Client(self.daemon.url, token="") as c:
            self.assertEqual(c.info()["user"]["name"], pwd.getpwuid(os.getuid()).pw_name)
        # A token sent is checked, never replaced by the loopback account.
        with self.assertRaises(gpujob.Unauthorized) as cm:
            gpujob.Client(self.daemon.url, token="gj_000000000000_" + "0" * 64).info()
        e = cm.exception
        self.assertEqual((e.status, e.code, e.field), (401, "unauthorized", "headers.Authorization"))
        token = self.daemon.token_create("alice")
        env = dict(os.environ, GPUJOB_TOKEN=token, GPUJOB_URL=self.daemon.url)
        with mock_environ(env), gpujob.Client() as c:
            self.assertEqual(c.info()["user"]["name"], "alice")
            with self.assertRaises(gpujob.Forbidden):
                c.usage(user="bob")

    def test_queue_limit_is_too_many_requests_with_its_key(self):
        with gpujob.Client(self.daemon.url, token=self.daemon.token_create("carol")) as c:
            running = c.submit(**slow_job(3000))
            queued = c.submit(**slow_job(3000))
            with self.assertRaises(gpujob.TooManyRequests) as cm:
                c.submit(**slow_job(3000))
            e = cm.exception
            self.assertEqual((e.status, e.code), (429, "quota_exceeded"))
            self.assertEqual(e.field, "limits.max_queued_per_user")
            for job in (queued, running):
                c.cancel(job)


    def test_spent_budget_is_too_many_requests_with_its_reset(self):
        with gpujob.Client(self.daemon.url, token=self.daemon.token_create("dave")) as c:
            budget = c.usage()["budgets"][0]
            self.assertEqual((budget["window"], budget["key"]), ("day", "user.dave.gpu_hours_per_day"))
            self.assertFalse(budget["exceeded"])
            c.wait(c.submit(**slow_job(600)), timeout=30)  # 0.6 s of its 0.36 s a day
            with self.assertRaises(gpujob.TooManyRequests) as cm:
                c.submit(**slow_job(10))
            e = cm.exception
            self.assertEqual((e.status, e.code, e.field),
                             (429, "budget_exceeded", "user.dave.gpu_hours_per_day"))
            budget = c.usage()["budgets"][0]
            self.assertTrue(budget["exceeded"])
            self.assertEqual(e.reset_at, budget["reset_at"])
            self.assertGreater(e.retry_after, 0)
            self.assertLessEqual(e.retry_after, 86400)


class TestDrain(unittest.TestCase):
    def test_draining_daemon_is_unavailable_with_retry_after(self):
        daemon = Daemon("[server]\ndrain_timeout_ms = 60000\n[scheduler]\ncpu_threads = 1\n")
        try:
            c = gpujob.Client(daemon.url)
            self.addCleanup(c.close)
            slow = c.submit(**slow_job(3000))
            for _ in range(500):
                if slow.refresh().state == "running":
                    break
                time.sleep(0.01)
            self.assertEqual(slow.state, "running")
            daemon.proc.send_signal(signal.SIGTERM)
            with self.assertRaises(gpujob.Unavailable) as ready:
                for _ in range(1000):
                    c.health()
                    time.sleep(0.01)
            self.assertEqual(ready.exception.status, 503)
            with self.assertRaises(gpujob.Unavailable) as cm:
                c.submit("add", {"x": np.ones(1, np.float32), "y": np.ones(1, np.float32)})
            self.assertEqual((cm.exception.status, cm.exception.code), (503, "unavailable"))
            self.assertIsNotNone(cm.exception.retry_after)
        finally:
            daemon.stop()


class TestKeepAlive(unittest.TestCase):
    def test_connection_the_daemon_closed_when_idle_is_reopened(self):
        daemon = Daemon("[server]\nidle_timeout_s = 1\n")
        try:
            with gpujob.Client(daemon.url) as c:
                x = np.ones(3, np.float32)
                c.run("add", {"x": x, "y": x})
                first = c.transport.conn.sock.getsockname()
                time.sleep(2.5)  # past the idle timeout: the daemon has closed the connection
                np.testing.assert_array_equal(c.run("add", {"x": x, "y": x})["out"], x + x)
                self.assertNotEqual(c.transport.conn.sock.getsockname(), first)
        finally:
            daemon.stop()


class TestErrorTable(unittest.TestCase):
    """The statuses no test here provokes from the daemon map like the others."""

    def test_every_status_maps_to_its_class(self):
        from gpujob.errors import error_for

        table = {410: gpujob.Expired, 415: gpujob.UnsupportedMediaType,
                 422: gpujob.Unprocessable, 507: gpujob.InsufficientStorage}
        for status, cls in table.items():
            body = {"error": {"code": "c", "message": "m", "field": "f"}}
            e = error_for(status, body, 3)
            self.assertIs(type(e), cls)
            self.assertEqual((e.status, e.code, e.message, e.field, e.retry_after),
                             (status, "c", "m", "f", 3))
        odd = error_for(418, None)
        self.assertIs(type(odd), gpujob.GpujobError)
        self.assertEqual((odd.status, odd.code, odd.field), (418, "http_418", None))


class TestTls(unittest.TestCase):
    """The daemon serving HTTPS with a certificate of a CA that openssl makes here."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpujob-py-tls-")
        script = (
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
            "-keyout ca.key -out ca.pem -days 2 -subj /CN=gpujob-py-ca && "
            "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
            "-keyout srv.key -out srv.csr -subj /CN=localhost && "
            "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' >san && "
            "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
            "-out srv.pem -days 2 -extfile san")
        subprocess.run(["sh", "-c", script], cwd=cls.dir, check=True, capture_output=True)
        cls.daemon = Daemon(f"[server]\ntls_cert = {cls.dir}/srv.pem\n"
                            f"tls_key = {cls.dir}/srv.key\n", workdir=cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_https_with_the_ca_file_runs_jobs_and_without_it_fails(self):
        self.assertTrue(self.daemon.url.startswith("https://"), self.daemon.url)
        x = np.arange(5, dtype=np.float32)
        env = dict(os.environ, GPUJOB_CA_FILE=os.path.join(self.dir, "ca.pem"))
        with mock_environ(env), gpujob.Client(self.daemon.url) as c:
            np.testing.assert_array_equal(c.run("add", {"x": x, "y": x})["out"], x + x)
        with self.assertRaises(gpujob.ConnectionFailed) as cm:
            gpujob.Client(self.daemon.url).info()
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(cm.exception))


@contextlib.contextmanager
def mock_environ(env):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class TestInstall(unittest.TestCase):
    def test_pip_installs_the_package(self):
        source = os.path.dirname(HERE)
        with tempfile.TemporaryDirectory() as target, tempfile.TemporaryDirectory() as build:
            # A copy of the source, so that the build leaves nothing in the repository.
            subprocess.run(["cp", "-r", source, build], check=True)
            copy = os.path.join(build, os.path.basename(source))
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--root-user-action=ignore",
                            "--no-build-isolation", "--no-index", "--target", target, copy],
                           check=True)
            out = subprocess.run([sys.executable, "-c",
                                  "import gpujob; print(gpujob.__file__, gpujob.Client)"],
                                 cwd=target, env=dict(os.environ, PYTHONPATH=target),
                                 check=True, capture_output=True, text=True)
            self.assertTrue(out.stdout.startswith(target), out.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
