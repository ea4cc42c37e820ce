// The status page of gpujobd: reads the daemon's JSON API (the same routes and the same
// tokens as every client) and draws it. No library, no build step: the daemon serves this file
// as it is. Every value from the API reaches the page through textContent, never as markup.
'use strict';

const TOKEN_KEY = 'gpujob.token';
const REFRESH_MS = 5000;
const WINDOW_MIN = 15;
const SVG = 'http://www.w3.org/2000/svg';

const $ = (id) => document.getElementById(id);
let info = null; // GET /v1/info: the ops, the backend and who we are
let timer = null; // the "now" view's refresh
let jobsNext = null; // the job list's next page cursor

// An answer the page cannot use: its message is shown to the user.
class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Calls the API with the token of this tab, if there is one. A 401 forgets the token and asks
// for one; other errors carry the API's own message.
async function api(path, method = 'GET') {
  const headers = {Accept: 'application/json'};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  const resp = await fetch(path, {method, headers, cache: 'no-store'});
  let body = null;
  try {
    body = await resp.json();
  } catch (e) {
    body = null;
  }
  if (resp.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(token ? 'That token was refused: ' + errorText(body) : '');
    throw new ApiError(401, errorText(body));
  }
  if (!resp.ok) throw new ApiError(resp.status, errorText(body) || resp.statusText);
  return body;
}

function errorText(body) {
  return body && body.error ? body.error.message : '';
}

function showMessage(text) {
  $('message').textContent = text;
  $('message').hidden = !text;
}

function showLogin(text) {
  stopRefresh();
  info = null;
  for (const v of document.querySelectorAll('.view')) v.hidden = true;
  $('login').hidden = false;
  $('signout').hidden = true;
  $('who').textContent = '';
  showMessage(text);
  $('token').focus();
}

// Builds an element with text, attributes and children.
function el(tag, opts = {}, ...children) {
  const e = document.createElement(tag);
  if (opts.text !== undefined && opts.text !== null) e.textContent = String(opts.text);
  if (opts.cls) e.className = opts.cls;
  for (const [k, v] of Object.entries(opts.data || {})) e.dataset[k] = v === null ? '' : String(v);
  if (opts.href) e.href = opts.href;
  for (const c of children) e.append(c);
  return e;
}

function fillBody(table, rows) {
  table.tBodies[0].replaceChildren(...rows);
}

function td(value, opts = {}) {
  return el('td', opts.num ? {...opts, cls: 'num' + (opts.cls ? ' ' + opts.cls : '')} : opts,
            ...(value instanceof Node ? [value] : [document.createTextNode(fmt(value))]));
}

function fmt(v) {
  if (v === null || v === undefined) return '–';
  if (typeof v === 'number' && !Number.isInteger(v)) return v.toFixed(v < 10 ? 2 : 1);
  return String(v);
}

function bytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return (i ? n.toFixed(1) : String(n)) + ' ' + units[i];
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : '–';
}

// --- routing: #/now, #/jobs?user=&op=&state=, #/job/ID, #/usage ---

function parseHash() {
  const h = location.hash.replace(/^#\/?/, '');
  const [path, query] = h.split('?');
  return {parts: path.split('/').filter(Boolean), params: new URLSearchParams(query || '')};
}

function stopRefresh() {
  if (timer) clearInterval(timer);
  timer = null;
}

async function route() {
  if (!info) return;
  stopRefresh();
  showMessage('');
  const {parts, params} = parseHash();
  const view = parts[0] === 'job' && parts[1] ? 'job' : ['jobs', 'usage'].includes(parts[0]) ? parts[0] : 'now';
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'view-' + view;
  for (const a of document.querySelectorAll('nav a'))
    a.classList.toggle('current', a.id === 'nav-' + (view === 'job' ? 'jobs' : view));
  try {
    if (view === 'now') {
      await refreshNow();
      timer = setInterval(() => refreshNow().catch(report), REFRESH_MS);
    } else if (view === 'jobs') {
      await showJobs(params);
    } else if (view === 'job') {
      await showJob(decodeURIComponent(parts[1]));
    } else {
      await showUsage(params);
    }
  } catch (e) {
    report(e);
  }
}

function report(e) {
  if (e instanceof ApiError && e.status === 401) return; // the login form says it
  showMessage(e.message || String(e));
}

// --- now: devices, queue, recent throughput and latency ---

// A device's memory, used / total, which may wrap after the slash (never inside a figure):
// a GPU's figures with their units do not fit a narrow panel on one line beside the others.
function memoryText(used, total) {
  return el('span', {}, el('span', {text: bytes(used), cls: 'nowrap'}), ' / ',
            el('span', {text: bytes(total), cls: 'nowrap'}));
}

async function refreshNow() {
  const s = await api('/v1/stats?minutes=' + WINDOW_MIN);
  const backend = info.backend ? info.backend.name : 'unknown';
  $('backend').textContent = s.gpus.length ? '' : 'No GPUs: the ' + backend + ' backend runs the jobs.';
  $('gpus').hidden = !s.gpus.length;
  fillBody($('gpus'), s.gpus.map((g) => el('tr', {data: {gpu: g.index}},
    td(g.index), td(g.state),
    td(g.utilization_pct === null ? null : g.utilization_pct + ' %', {num: true, data: {value: g.utilization_pct}, cls: 'util'}),
    td(g.memory_used_bytes === null ? null : memoryText(g.memory_used_bytes, g.memory_total_bytes),
       {num: true, data: {used: g.memory_used_bytes, total: g.memory_total_bytes}, cls: 'memory'}),
    td(g.temperature_c === null ? null : g.temperature_c + ' °C', {num: true, data: {value: g.temperature_c}, cls: 'temp'}))));
  $('queued').textContent = s.queue.queued;
  $('running').textContent = s.queue.running;
  fillBody($('queue-users'), s.queue.users.map((u) => el('tr', {data: {user: u.user}},
    td(u.user), td(u.queued, {num: true, cls: 'queued'}), td(u.running, {num: true, cls: 'running'}))));
  $('queue-partial').hidden = s.queue.complete && s.recent.complete;
  $('window-min').textContent = s.recent.minutes;
  $('recent-jobs').textContent = s.recent.jobs;
  $('recent-p50').textContent = s.recent.p50_ms === null ? '–' : fmt(s.recent.p50_ms) + ' ms';
  $('recent-p99').textContent = s.recent.p99_ms === null ? '–' : fmt(s.recent.p99_ms) + ' ms';
  drawBars($('chart-throughput'), s.recent.series.map((b) => b.jobs), s.recent.series);
  drawLines($('chart-latency'), [['p50', s.recent.series.map((b) => b.p50_ms)],
                                 ['p99', s.recent.series.map((b) => b.p99_ms)]]);
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

const W = 300, H = 90, PAD = 14;

function chartFrame(box, max) {
  const svg = svgEl('svg', {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img'});
  svg.append(svgEl('line', {x1: 0, y1: H - PAD, x2: W, y2: H - PAD, class: 'axis'}));
  svg.append(svgEl('text', {x: 2, y: 10}, fmt(max)));
  box.replaceChildren(svg);
  return svg;
}

// One bar per minute, its count on hover.
function drawBars(box, values, series) {
  const max = Math.max(1, ...values);
  const svg = chartFrame(box, max);
  const w = W / Math.max(1, values.length);
  values.forEach((v, i) => {
    const h = (v / max) * (H - PAD - 12);
    const r = svgEl('rect', {x: i * w + 1, y: H - PAD - h, width: Math.max(1, w - 2), height: h, class: 'bar'});
    r.append(svgEl('title', {}, `${when(series[i].start)}: ${v} jobs`));
    svg.append(r);
  });
}

// A line per named series; a minute without jobs (null) breaks the line.
function drawLines(box, named) {
  const all = named.flatMap(([, vs]) => vs.filter((v) => v !== null));
  const max = Math.max(1, ...all);
  const svg = chartFrame(box, max);
  for (const [name, values] of named) {
    const w = W / Math.max(1, values.length);
    let d = '', pen = false;
    values.forEach((v, i) => {
      if (v === null) {
        pen = false;
        return;
      }
      const x = i * w + w / 2, y = H - PAD - (v / max) * (H - PAD - 12);
      d += `${pen ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)}`;
      pen = true;
    });
    if (d) svg.append(svgEl('path', {d, class: name}));
    // A dot per minute too: a lone minute between empty ones has no line to show it.
    values.forEach((v, i) => {
      if (v === null) return;
      const dot = svgEl('circle', {cx: i * w + w / 2, cy: H - PAD - (v / max) * (H - PAD - 12), r: 2.5, class: name + ' dot'});
      dot.append(svgEl('title', {}, `${name}: ${fmt(v)} ms`));
      svg.append(dot);
    });
  }
}

// --- jobs: the filtered list, and one job ---

async function showJobs(params) {
  $('filter-user').value = params.get('user') || '';
  $('filter-op').value = params.get('op') || '';
  $('filter-state').value = params.get('state') || '';
  jobsNext = null;
  fillBody($('jobs'), []);
  await loadJobs(params);
}

async function loadJobs(params) {
  const q = new URLSearchParams();
  for (const k of ['user', 'op', 'state']) if (params.get(k)) q.set(k, params.get(k));
  q.set('limit', '50');
  if (jobsNext) q.set('after', jobsNext);
  const page = await api('/v1/jobs?' + q);
  const body = $('jobs').tBodies[0];
  for (const j of page.jobs)
    body.append(el('tr', {data: {job: j.id}},
      td(el('a', {href: '#/job/' + encodeURIComponent(j.id), text: j.id})),
      td(j.owner), td(j.op), td(j.state, {cls: 'state-' + j.state}), td(when(j.created_at)),
      td(j.run_ms, {num: true})));
  if (!body.rows.length) body.append(el('tr', {}, el('td', {text: 'No jobs.', cls: 'muted'})));
  jobsNext = page.next;
  $('jobs-more').hidden = !jobsNext;
}

function mayCancel(job) {
  const live = job.state === 'queued' || job.state === 'running';
  return live && (info.user.admin || job.owner === info.user.name);
}

async function showJob(id) {
  // Nothing of the job shown before stays while this one loads, or when it cannot be seen.
  $('cancel').hidden = true;
  $('job-id').textContent = id;
  $('job-fields').replaceChildren();
  fillBody($('job-inputs'), []);
  fillBody($('job-outputs'), []);
  const j = await api('/v1/jobs/' + encodeURIComponent(id));
  $('job-id').textContent = j.id;
  const waiting = j.waiting ? j.waiting.reason + (j.waiting.limit ? ' (' + j.waiting.limit + ')' : '') +
                              ', ' + j.waiting.position + ' ahead' : null;
  const fields = [
    ['state', 'State', j.state], ['owner', 'User', j.owner], ['op', 'Op', j.op],
    ['waiting', 'Waits for', waiting],
    ['created_at', 'Submitted', when(j.created_at)], ['started_at', 'Started', when(j.started_at)],
    ['finished_at', 'Finished', when(j.finished_at)],
    ['queue_ms', 'Queued (ms)', j.queue_ms], ['run_ms', 'Ran (ms)', j.run_ms],
    ['gpu_ms', 'Device time (ms)', j.gpu_ms], ['batch_size', 'Batch size', j.batch_size],
    ['batch_gpu_ms', 'Batch device time (ms)', j.batch_gpu_ms],
    ['device', 'Device asked', j.device], ['run_device', 'Ran on device', j.run_device],
    ['priority', 'Priority', j.priority], ['attempts', 'Attempts', j.attempts],
    ['error', 'Error', j.error ? j.error.code + ': ' + j.error.message : null],
  ];
  $('job-fields').replaceChildren(...fields.filter(([k, , v]) => k !== 'waiting' || v !== null).flatMap(
    ([k, label, v]) => [el('dt', {text: label}), el('dd', {text: fmt(v), data: {field: k}})]));
  // inputs and outputs are objects by name; an input drawn from a buffer names it.
  const tensorRows = (ts) => Object.entries(ts || {}).map(([name, t]) => el('tr', {data: {tensor: name}},
    td(name + (t.buffer ? ' (' + t.buffer + ')' : '')), td(t.dtype), td('[' + (t.shape || []).join(', ') + ']'), td(t.bytes, {num: true})));
  fillBody($('job-inputs'), tensorRows(j.inputs));
  fillBody($('job-outputs'), tensorRows(j.outputs));
  const cancel = $('cancel');
  cancel.hidden = !mayCancel(j);
  cancel.dataset.job = j.id;
}

async function cancelJob() {
  const id = $('cancel').dataset.job;
  $('cancel').disabled = true;
  try {
    await api('/v1/jobs/' + encodeURIComponent(id), 'DELETE');
    await showJob(id);
  } catch (e) {
    report(e);
  } finally {
    $('cancel').disabled = false;
  }
}

// --- usage: per user and op over the chosen days ---

function isoDay(d) {
  return d.toISOString().slice(0, 10);
}

async function showUsage(params) {
  const today = new Date();
  const since = params.get('since') || isoDay(new Date(today.getTime() - 6 * 86400000));
  const until = params.get('until') || isoDay(today);
  $('usage-since').value = since;
  $('usage-until').value = until;
  $('usage-user').value = params.get('user') || '';
  const q = new URLSearchParams({since, until});
  if (info.user.admin) q.set('user', params.get('user') || 'all');
  const u = await api('/v1/usage?' + q);
  const sums = new Map();
  for (const d of u.days) {
    const key = d.user + '\u0000' + d.op;
    const s = sums.get(key) || {user: d.user, op: d.op, jobs: 0, succeeded: 0, failed: 0, cancelled: 0, run_ms: 0, gpu_ms: 0};
    for (const k of ['jobs', 'succeeded', 'failed', 'cancelled', 'run_ms', 'gpu_ms']) s[k] += d[k];
    sums.set(key, s);
  }
  const rows = [...sums.values()].map((s) => el('tr', {data: {user: s.user, op: s.op}},
    td(s.user), td(s.op), td(s.jobs, {num: true}), td(s.succeeded, {num: true}),
    td(s.failed, {num: true}), td(s.cancelled, {num: true}),
    td((s.run_ms / 1000).toFixed(2), {num: true}), td((s.gpu_ms / 1000).toFixed(2), {num: true})));
  if (!rows.length) rows.push(el('tr', {}, el('td', {text: 'No jobs ended in these days.', cls: 'muted'})));
  fillBody($('usage'), rows);
  showBudgets(u.budgets || []);
}

// The user's GPU-time budgets (none for every user's rows): used, left and when each resets.
function showBudgets(budgets) {
  const hours = (ms) => (ms / 3600000).toPrecision(3) + ' h';
  const items = budgets.map((b) => el('li', {cls: b.exceeded ? 'budget spent' : 'budget', data: {window: b.window}},
    `GPU time per ${b.window} (${b.key}): ${hours(b.used_gpu_ms)} of ${hours(b.gpu_ms)} used, ` +
    `${hours(b.left_gpu_ms)} left` + (b.exceeded ? ' — spent: new jobs are refused' : '') +
    `; resets ${b.reset_at.slice(0, 16).replace('T', ' ')} UTC`));
  $('usage-budgets').replaceChildren(...items);
  $('usage-budgets').hidden = !items.length;
}

// --- start ---

function setHashFromForm(view, fields) {
  const q = new URLSearchParams();
  for (const [k, id] of fields) if ($(id).value) q.set(k, $(id).value);
  const s = q.toString();
  const target = '#/' + view + (s ? '?' + s : '');
  if (location.hash === target) route(); else location.hash = target;
}

// Asks first whether the tab's credentials identify a user (GET /ui/session answers 200
// either way), so that a missing token shows the form rather than a 401 in the console.
async function start() {
  try {
    const session = await api('/ui/session');
    if (!session.user) {
      showLogin(session.refused ? 'That token was refused: ' + session.refused : '');
      return;
    }
    info = await api('/v1/info');
  } catch (e) {
    report(e);
    return;
  }
  $('login').hidden = true;
  $('who').textContent = info.user.name + (info.user.admin ? ' (admin)' : '');
  $('signout').hidden = !sessionStorage.getItem(TOKEN_KEY);
  $('filter-user-label').hidden = !info.user.admin;
  $('usage-user-label').hidden = !info.user.admin;
  const ops = $('filter-op');
  ops.replaceChildren(el('option', {text: 'any'}), ...info.ops.map((o) => el('option', {text: o.name})));
  ops.options[0].value = '';
  await route();
}

document.addEventListener('DOMContentLoaded', () => {
  $('login').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
    $('token').value = '';
    showMessage('');
    start();
  });
  $('signout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin('');
  });
  $('job-filter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    setHashFromForm('jobs', [['user', 'filter-user'], ['op', 'filter-op'], ['state', 'filter-state']]);
  });
  $('usage-filter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    setHashFromForm('usage', [['since', 'usage-since'], ['until', 'usage-until'], ['user', 'usage-user']]);
  });
  $('jobs-more').addEventListener('click', () => loadJobs(parseHash().params).catch(report));
  $('cancel').addEventListener('click', cancelJob);
  window.addEventListener('hashchange', route);
  start();
});
