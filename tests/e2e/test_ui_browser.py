#!/usr/bin/env python3
"""The status page in a real headless Chromium, against a real gpujobd.

The test starts gpujobd on the CPU backend with [auth] mode = token and three tokens made by
`gpujobd token create` (alice, bob, and admin, an admin), and [debug] test_ops so that a long
debug_sleep holds the one worker while other jobs queue. Then, driving Chromium through
Selenium (Debian's chromium, chromium-driver and python3-selenium, from scripts/deps.sh):

- the page asks for a token, and with the admin's shows in its GPU and queue panels the numbers
  that GET /v1/stats gives the test for the same token;
- with its fetch of GET /v1/stats answered by the capture of a daemon on an NVIDIA H200
  (tests/fixtures/h200/stats.json, injected before the page loads with Chromium's
  Page.addScriptToEvaluateOnNewDocument), the GPU panel shows that device's utilisation, memory
  used and total, and temperature as the capture gives them, every column within the panel, at
  1280 and at 375 px wide, with no console error;
- the job list filtered by user shows that user's jobs, as GET /v1/jobs?user= lists them;
- a finished job's page shows its timings as GET /v1/jobs/{id} gives them;
- at 375 px wide no view overflows horizontally;
- bob's GET /v1/stats holds everyone's totals but only his own row and recent jobs;
- bob sees no cancel button on alice's job (which he may not see at all) and one on his own;
- alice cancels her queued job from its page, and the API then says it is cancelled;
- the usage view shows every user's jobs per op as GET /v1/usage gives them to the admin, and
  alice her month's GPU-time budget;
- with [auth] mode = none on loopback the page asks for no token;
- the browser's console holds no error but the one 404 that bob's look at alice's job causes.

Screenshots of the desktop and the phone views (and of the H200's: ui-h200-*.png) are saved
under GPUJOB_ARTIFACT_DIR. It exits
77 (skipped), saying why, only when selenium or Chromium is not installed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from gpujobd_process import GpujobdProcess

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as e:
    print(f"SKIP: python3-selenium is not installed ({e}): scripts/deps.sh installs it")
    sys.exit(77)

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
START_TIMEOUT_S = 30
WAIT_S = 20
LONG_JOB_MS = 60000

DAEMON_CONFIG = """\
[auth]
mode = token
admins = admin
[limits]
max_running_per_user = 1
[scheduler]
cpu_threads = 1
[debug]
test_ops = true
[user.alice]
gpu_hours_per_month = 100
"""


class Daemon(GpujobdProcess):
    """The real gpujobd with a token per user (mode token), or none (mode none)."""

    def __init__(self, binary, workdir, users, config=DAEMON_CONFIG):
        self.state_dir = os.path.join(workdir, "state")
        os.makedirs(self.state_dir)
        self.config_path = os.path.join(workdir, "gpujobd.conf")
        with open(self.config_path, "w", encoding="utf-8") as f:
            f.write(config)
        common = ["--config", self.config_path, "--state-dir", self.state_dir]
        self.tokens = {}
        for user in users:
            out = subprocess.run([binary, "token", "create", *common, "--user", user, "--name",
                                  "ui-test"], check=True, capture_output=True, text=True).stdout
            self.tokens[user] = out.strip().splitlines()[-1]
        # GPUJOB_E2E_BACKEND=cuda, as for the C suites, shows the GPU panel real devices.
        backend = os.environ.get("GPUJOB_E2E_BACKEND", "cpu")
        super().__init__([binary, *common, "--listen", "127.0.0.1:0", "--backend", backend,
                          "--log-level", "info"], START_TIMEOUT_S)

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def api(self, user, method, path, body=None):
        """The API's JSON answer to user's request, and its status."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url(path), data=data, method=method, headers={
            "Authorization": "Bearer " + self.tokens[user], "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


class Check:
    """Counts failed expectations, printing each, so that one run reports them all."""

    def __init__(self):
        self.failures = 0

    def expect(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failures += 1
        return ok


def sleep_job(ms):
    return {"op": "debug_sleep", "params": {"ms": ms},
            "inputs": {"x": {"dtype": "f32", "shape": [2], "data": [1, 2]}}}


def submit(d, user, ms, query=""):
    status, job = d.api(user, "POST", "/v1/jobs" + query, sleep_job(ms))
    if status not in (200, 201, 202):
        raise RuntimeError(f"submitting as {user}: {status} {job}")
    return job


def wait_until(what, predicate, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError("timed out waiting for " + what)


def start_browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Chromium runs as root in CI: no sandbox there; no GPU and a small /dev/shm either.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class Page:
    """The status page in one browser tab."""

    def __init__(self, driver, daemon):
        self.driver, self.d = driver, daemon

    def wait(self, what, predicate):
        # The page replaces what it redraws: an element read while it does is tried again.
        ignored = (NoSuchElementException, StaleElementReferenceException)
        return WebDriverWait(self.driver, WAIT_S, ignored_exceptions=ignored).until(
            lambda _: predicate(), message=what)

    def text(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css).text

    def visible(self, css):
        found = self.driver.find_elements(By.CSS_SELECTOR, css)
        return bool(found) and found[0].is_displayed()

    def go(self, fragment):
        self.driver.get(self.d.url("/#" + fragment))

    def wait_job(self, job_id):
        """Until the job's page has shown job_id's fields."""
        self.wait("the page of " + job_id, lambda: self.text("#job-id") == job_id and
                  self.driver.find_elements(By.CSS_SELECTOR, 'dd[data-field="state"]'))

    def sign_in(self, user):
        """Loads the page without a token: it asks for one; then gives user's."""
        self.driver.get(self.d.url("/"))
        self.wait("the token form", lambda: self.visible("#login"))
        self.driver.find_element(By.ID, "token").send_keys(self.d.tokens[user])
        self.driver.find_element(By.CSS_SELECTOR, "#login button").click()
        self.wait("the signed-in user", lambda: self.text("#who").startswith(user))

    def sign_out(self):
        self.driver.find_element(By.ID, "signout").click()
        self.wait("the token form", lambda: self.visible("#login"))

    def console_errors(self, allowed=()):
        """The console's SEVERE entries since the last call: those matching allowed, and the
        others."""
        severe = [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]
        expected = [m for m in severe if any(re.search(a, m) for a in allowed)]
        return expected, [m for m in severe if m not in expected]

    def overflow(self):
        """How many CSS pixels the page is wider than the viewport."""
        return self.driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")


def number(text):
    m = re.search(r"-?\d+(\.\d+)?", text)
    return float(m.group(0)) if m else None


def check_now_panel(c, page, d):
    """The GPU and queue panels against GET /v1/stats for the same (admin) token."""
    page.go("/now")
    status, stats = d.api("admin", "GET", "/v1/stats?minutes=15")
    c.expect(status == 200, "GET /v1/stats answers the admin")
    q = stats["queue"]
    try:
        page.wait("the queue totals", lambda: page.text("#queued") == str(q["queued"]) and
                  page.text("#running") == str(q["running"]))
        c.expect(True, f"the queue panel shows {q['queued']} queued and {q['running']} running")
    except Exception:
        c.expect(False, f"the queue panel shows {page.text('#queued')} queued and "
                        f"{page.text('#running')} running; the API says {q['queued']} and "
                        f"{q['running']}")
    # Read in one script: the panel is redrawn every few seconds, and a row read across a
    # redraw would be stale.
    shown = {u: tuple(v) for u, v in page.driver.execute_script("""
        const rows = {};
        for (const tr of document.querySelectorAll('#queue-users tbody tr'))
          rows[tr.dataset.user] = [+tr.querySelector('.queued').textContent,
                                   +tr.querySelector('.running').textContent];
        return rows;""").items()}
    want = {u["user"]: (u["queued"], u["running"]) for u in q["users"]}
    c.expect(shown == want and set(want) == {"alice", "bob"},
             f"the per-user rows {shown} are the API's {want}")
    gpus = page.driver.execute_script("""
        return [...document.querySelectorAll('#gpus tbody tr')].map((tr) => ({
          index: +tr.dataset.gpu, util: tr.querySelector('.util').dataset.value,
          used: tr.querySelector('.memory').dataset.used,
          temp: tr.querySelector('.temp').dataset.value}));""")
    c.expect(len(gpus) == len(stats["gpus"]), f"the GPU panel has a row per device ({len(gpus)})")
    as_text = lambda v: "" if v is None else str(v)  # noqa: E731
    for row, g in zip(gpus, stats["gpus"]):
        c.expect(row["index"] == g["index"] and row["util"] == as_text(g["utilization_pct"]) and
                 row["used"] == as_text(g["memory_used_bytes"]) and
                 row["temp"] == as_text(g["temperature_c"]),
                 f"GPU {g['index']}: utilisation, memory and temperature as the API gives them")
    if not stats["gpus"]:
        c.expect("cpu backend" in page.text("#backend"), "without GPUs the panel names the backend")
    c.expect(page.text("#recent-jobs") == str(stats["recent"]["jobs"]),
             f"the recent panel counts {stats['recent']['jobs']} jobs")
    bars = page.driver.find_elements(By.CSS_SELECTOR, "#chart-throughput rect")
    c.expect(len(bars) == len(stats["recent"]["series"]), "the throughput chart has a bar a minute")
    c.expect(len(page.driver.find_elements(By.CSS_SELECTOR, "#chart-latency path.p50")) == 1,
             "the latency chart draws the p50 line")


# GET /v1/stats of a daemon on an NVIDIA H200 (tests/fixtures/h200/README.md says how).
H200_STATS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "h200",
                          "stats.json")
# Run before the page's own scripts: its fetch of /v1/stats is answered with CAPTURED, every
# other request goes to the daemon.
FETCH_STATS_FROM = """
(() => {
  const captured = %s;
  const daemonFetch = window.fetch;
  window.fetch = function (input, init) {
    const url = new URL(typeof input === 'string' ? input : input.url, location.href);
    if (url.pathname === '/v1/stats')
      return Promise.resolve(new Response(JSON.stringify(captured), {
        status: 200, headers: {'Content-Type': 'application/json'}}));
    return daemonFetch.apply(this, arguments);
  };
})();
"""


def gib_text(n):
    """Bytes as the page writes them past a GiB: one decimal."""
    return f"{n / 2**30:.1f} GiB"


def check_h200_gpu_panel(c, page, artifacts):
    """The GPU panel with a real H200's /v1/stats: the page runs against its daemon, but its
    fetch of /v1/stats gets the captured answer, injected before the page loads. The panel shows
    the device's utilisation, memory used and total, and temperature as the capture gives
    them, at desktop and at phone width, with no console error and no cut-off column."""
    with open(H200_STATS, encoding="utf-8") as f:
        stats = json.load(f)
    driver = page.driver
    script = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                    {"source": FETCH_STATS_FROM % json.dumps(stats)})
    try:
        for width, name in ((1280, "desktop"), (375, "phone")):
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 500})
            page.go("/now")
            driver.refresh()  # a new document, which the script runs in
            page.wait("the captured queue totals",
                      lambda: page.text("#recent-jobs") == str(stats["recent"]["jobs"]))
            rows = driver.find_elements(By.CSS_SELECTOR, "#gpus tbody tr")
            c.expect(len(rows) == len(stats["gpus"]) == 1,
                     f"{name}: the GPU panel has the H200's one row ({len(rows)})")
            for g in stats["gpus"]:
                tr = driver.find_element(By.CSS_SELECTOR,
                                         f'#gpus tbody tr[data-gpu="{g["index"]}"]')
                cell = {k: tr.find_element(By.CSS_SELECTOR, "." + k)
                        for k in ("util", "memory", "temp")}
                want = {"util": f"{g['utilization_pct']} %",
                        "memory": f"{gib_text(g['memory_used_bytes'])} / "
                                  f"{gib_text(g['memory_total_bytes'])}",
                        "temp": f"{g['temperature_c']} °C"}
                shown = {k: " ".join(v.text.split()) for k, v in cell.items()}
                c.expect(shown == want, f"{name}: GPU {g['index']} reads {shown}; the H200 "
                                        f"gave {want}")
                data = (cell["util"].get_attribute("data-value"),
                        cell["memory"].get_attribute("data-used"),
                        cell["memory"].get_attribute("data-total"),
                        cell["temp"].get_attribute("data-value"))
                c.expect(data == tuple(str(g[k]) for k in (
                    "utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c")),
                    f"{name}: its cells carry the H200's numbers {data}")
                c.expect(all(v.is_displayed() for v in cell.values()) and
                         tr.find_elements(By.TAG_NAME, "td")[1].text == g["state"],
                         f"{name}: its cells are shown, its state {g['state']}")
            c.expect(page.text("#backend") == "", f"{name}: no 'No GPUs' note beside a GPU")
            cut = driver.execute_script(
                "const s = document.getElementById('gpus').parentElement;"
                "return s.scrollWidth - s.clientWidth;")
            c.expect(cut <= 0 and page.overflow() <= 0,
                     f"{name}: the GPU table fits its panel ({cut} px over) and the page its "
                     f"width ({page.overflow()} px over)")
            driver.save_screenshot(os.path.join(artifacts, f"ui-h200-{name}.png"))
            _, errors = page.console_errors()
            c.expect(not errors, f"{name}: no console errors with the H200's stats: {errors}")
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                               {"identifier": script["identifier"]})
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        page.go("/now")
        driver.refresh()


def check_stats_scope(c, d):
    """A user's /v1/stats: everyone's totals, but only their own row."""
    _, admin = d.api("admin", "GET", "/v1/stats")
    _, bob = d.api("bob", "GET", "/v1/stats")
    c.expect([u["user"] for u in bob["queue"]["users"]] == ["bob"], "bob's stats hold his row only")
    c.expect((bob["queue"]["queued"], bob["queue"]["running"]) ==
             (admin["queue"]["queued"], admin["queue"]["running"]), "and everyone's totals")
    c.expect(bob["recent"]["jobs"] == 0 and admin["recent"]["jobs"] == 1,
             "and his own recent jobs (none; alice's one is the admin's)")


def check_job_list(c, page, d):
    page.go("/jobs?user=bob")
    page.wait("bob's jobs", lambda: page.driver.find_elements(By.CSS_SELECTOR, "#jobs tr[data-job]"))
    shown = {r.get_attribute("data-job") for r in
             page.driver.find_elements(By.CSS_SELECTOR, "#jobs tr[data-job]")}
    _, listed = d.api("admin", "GET", "/v1/jobs?user=bob")
    want = {j["id"] for j in listed["jobs"]}
    c.expect(shown == want and len(want) == 2, f"the list filtered by user bob shows {len(want)} "
                                               "jobs, those of GET /v1/jobs?user=bob")


def check_job_page(c, page, d, job_id):
    """A finished job's timings as the API gives them."""
    page.go("/job/" + job_id)
    page.wait_job(job_id)
    _, job = d.api("admin", "GET", "/v1/jobs/" + job_id)
    for field in ("queue_ms", "run_ms", "gpu_ms", "batch_gpu_ms"):
        text = page.text(f'dd[data-field="{field}"]')
        c.expect(number(text) is not None and abs(number(text) - job[field]) < 0.06,
                 f"the job's {field} reads {text}; the API says {job[field]}")
    c.expect(page.text('dd[data-field="batch_size"]') == str(job["batch_size"]), "its batch size")
    for field in ("created_at", "started_at", "finished_at"):
        c.expect(page.text(f'dd[data-field="{field}"]') not in ("", "–"), f"its {field} is shown")
    c.expect(page.text('dd[data-field="state"]') == "succeeded", "its state")
    c.expect(page.text("#job-inputs tr[data-tensor='x'] td:nth-child(3)") == "[2]",
             "its input's shape")
    c.expect(not page.visible("#cancel"), "a finished job has no cancel button")


def check_usage(c, page, d):
    """The admin's usage view: every user's rows per op, summed as GET /v1/usage gives them."""
    page.go("/usage")
    page.wait("the usage rows", lambda: page.driver.find_elements(By.CSS_SELECTOR,
                                                                  "#usage tr[data-user]"))
    since = page.driver.find_element(By.ID, "usage-since").get_attribute("value")
    until = page.driver.find_element(By.ID, "usage-until").get_attribute("value")
    _, usage = d.api("admin", "GET", f"/v1/usage?user=all&since={since}&until={until}")
    want = {}
    for day in usage["days"]:
        want[(day["user"], day["op"])] = want.get((day["user"], day["op"]), 0) + day["jobs"]
    shown = {(r.get_attribute("data-user"), r.get_attribute("data-op")):
             int(r.find_elements(By.TAG_NAME, "td")[2].text)
             for r in page.driver.find_elements(By.CSS_SELECTOR, "#usage tr[data-user]")}
    c.expect(shown == want and ("alice", "debug_sleep") in want,
             f"the usage view shows {shown}, as the API's rows sum to {want}")


def check_open_loopback(c, driver, work):
    """With [auth] mode = none on loopback the page asks for nothing."""
    d = Daemon(os.environ["GPUJOBD_BIN"], os.path.join(work, "open"), [], "[auth]\nmode = none\n")
    try:
        page = Page(driver, d)
        driver.execute_script("sessionStorage.clear()")
        driver.get(d.url("/"))
        page.wait("the user local", lambda: page.text("#who").startswith("local"))
        c.expect(not page.visible("#login"), "mode none on loopback: no token is asked for")
        page.wait("the queue panel", lambda: page.text("#queued") == "0")
        _, errors = page.console_errors()
        c.expect(not errors, f"no console errors with mode none: {errors}")
    finally:
        d.kill()


def check_phone_width(c, page, job_id, artifacts):
    page.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 375, "height": 800, "deviceScaleFactor": 2, "mobile": True})
    for fragment in ("/now", "/jobs", "/job/" + job_id, "/usage"):
        page.go(fragment)
        view = "job" if fragment.startswith("/job/") else fragment[1:]
        page.wait("the view " + fragment, lambda: page.visible("#view-" + view))
        time.sleep(0.3)
        c.expect(page.overflow() <= 0, f"at 375 px {fragment} does not overflow "
                                       f"({page.overflow()} px)")
        if fragment == "/now":
            page.driver.save_screenshot(os.path.join(artifacts, "ui-phone.png"))
    page.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def check_cancel(c, page, d, alice_queued, bob_queued):
    page.sign_in("bob")
    page.go("/job/" + bob_queued)
    page.wait_job(bob_queued)
    c.expect(page.visible("#cancel"), "bob sees a cancel button on his own queued job")
    _, job = d.api("bob", "GET", "/v1/jobs/" + bob_queued)
    c.expect(job.get("waiting") and page.text('dd[data-field="waiting"]').startswith(
        job["waiting"]["reason"]), f"his job's page says why it waits ({job.get('waiting')})")
    # Then alice's, right after his own showed the button: it must go.
    page.go("/job/" + alice_queued)
    page.wait("the not-found message", lambda: page.visible("#message"))
    c.expect(not page.visible("#cancel"), "bob sees no cancel button on alice's job")
    expected, errors = page.console_errors(allowed=[re.escape(alice_queued) + ".*404"])
    # The one expected error proves that the console is read at all.
    c.expect(len(expected) == 1, f"the console shows the 404 of alice's job to bob: {expected}")
    c.expect(not errors, f"no other console errors as bob: {errors}")
    page.sign_out()

    page.sign_in("alice")
    page.go("/job/" + alice_queued)
    page.wait_job(alice_queued)
    c.expect(page.visible("#cancel"), "alice sees a cancel button on her queued job")
    page.driver.find_element(By.ID, "cancel").click()
    try:
        page.wait("the cancelled state", lambda: page.text('dd[data-field="state"]') == "cancelled")
        c.expect(True, "her job's page shows it cancelled")
    except Exception:
        c.expect(False, "her job's page shows " + page.text('dd[data-field="state"]'))
    _, job = d.api("alice", "GET", "/v1/jobs/" + alice_queued)
    c.expect(job["state"] == "cancelled", f"the API says her job is {job['state']}")
    c.expect(not page.visible("#cancel"), "the cancel button is gone once it is cancelled")
    _, errors = page.console_errors()
    c.expect(not errors, f"no console errors as alice: {errors}")


def check_budget(c, page, d):
    """alice's usage view shows her month's GPU-time budget as GET /v1/usage gives it."""
    page.go("/usage")
    page.wait("the budget", lambda: page.visible("#usage-budgets"))
    _, usage = d.api("alice", "GET", "/v1/usage")
    budget = usage["budgets"][0]
    text = page.text("#usage-budgets li[data-window='month']")
    c.expect("user.alice.gpu_hours_per_month" in text and "100 h" in text
             and budget["reset_at"][:10] in text and not budget["exceeded"],
             f"her usage view shows her month's budget ({text!r}, the API's {budget})")


def main():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            print(f"SKIP: {path} is missing: scripts/deps.sh installs chromium and chromium-driver")
            return 77
    artifacts = os.environ.get("GPUJOB_ARTIFACT_DIR") or os.getcwd()
    os.makedirs(artifacts, exist_ok=True)
    c = Check()
    with tempfile.TemporaryDirectory(prefix="gj-ui-") as work:
        d = Daemon(os.environ["GPUJOBD_BIN"], work, ["alice", "bob", "admin"])
        driver = None
        try:
            done = submit(d, "alice", 20, "?wait=10")
            c.expect(done["state"] == "succeeded", "alice's short job succeeded")
            long_job = submit(d, "alice", LONG_JOB_MS)
            wait_until("the long job to run",
                       lambda: d.api("alice", "GET", "/v1/jobs/" + long_job["id"])[1]["state"]
                       == "running")
            alice_queued = submit(d, "alice", 50)["id"]
            bob_queued = submit(d, "bob", 50)["id"]
            submit(d, "bob", 50)
            driver = start_browser()
            page = Page(driver, d)
            page.sign_in("admin")
            check_now_panel(c, page, d)
            check_stats_scope(c, d)
            driver.save_screenshot(os.path.join(artifacts, "ui-now.png"))
            check_h200_gpu_panel(c, page, artifacts)
            check_job_list(c, page, d)
            check_job_page(c, page, d, done["id"])
            driver.save_screenshot(os.path.join(artifacts, "ui-job.png"))
            check_usage(c, page, d)
            check_phone_width(c, page, done["id"], artifacts)
            _, errors = page.console_errors()
            c.expect(not errors, f"no console errors as the admin: {errors}")
            page.sign_out()
            check_cancel(c, page, d, alice_queued, bob_queued)
            check_budget(c, page, d)
            check_open_loopback(c, driver, work)
        except Exception as e:
            c.expect(False, f"{type(e).__name__}: {e}")
            if driver:
                driver.save_screenshot(os.path.join(artifacts, "ui-failure.png"))
        finally:
            if driver:
                driver.quit()
            d.kill()
        if c.failures:
            print("daemon log:\n" + d.log_text(40))
    print(f"screenshots in {artifacts}")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
