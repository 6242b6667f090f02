// rollgate's status page: the runs, one run's stages and nodes, the gate, the history and
// the controls, kept live by the event stream (GET /v1/events). The API token is asked
// once, kept in this tab's session storage and sent as the Authorization header.
'use strict';

const TOKEN_KEY = 'rollgate-token';
const view = { runs: [], run: null, gate: null, me: null, lastEventId: null, stream: null, refresh: null };

class AuthError extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replaceChildren would show a null as the text "null": absent parts are dropped.
function present(nodes) {
  return nodes.filter((n) => n !== null && n !== undefined);
}

function show(...nodes) {
  const main = document.getElementById('main');
  main.replaceChildren(...present(nodes));
}

async function api(path, options) {
  const opts = options || {};
  const headers = { Authorization: 'Bearer ' + token() };
  if (opts.body) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, { method: opts.method || 'GET', headers, body: opts.body });
  if (res.status === 401) throw new AuthError('the token was refused (401 Unauthorized): check it and log in again');
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.message || res.status + ' ' + res.statusText);
  return body;
}

function time(at) {
  if (!at) return '';
  const d = new Date(at);
  return d.toISOString().slice(11, 19);
}

// --- login -------------------------------------------------------------------------

function showLogin(reason) {
  stopStream();
  document.getElementById('logout').hidden = true;
  document.getElementById('who').hidden = true;
  const input = el('input', { id: 'token', type: 'password', autocomplete: 'off', placeholder: 'API token' });
  const form = el('form', { class: 'login', id: 'login-form', onsubmit: (e) => { e.preventDefault(); login(input.value.trim()); } },
    el('h1', {}, 'Log in to rollgate'),
    el('label', { for: 'token' }, 'API token (a client in server.tokens_dir, or server.token_file)'),
    input,
    el('p', { id: 'login-reason', class: 'reason' }, reason || ''),
    el('button', { id: 'login', type: 'submit' }, 'Log in'));
  show(form);
  input.focus();
}

// Who the token belongs to and what it may do; the page needs `read`.
async function whoami() {
  const me = await api('/v1/whoami');
  if (!me.scopes.includes('read')) {
    throw new AuthError('client ' + me.client + ' lacks scope read, which the status page needs: grant it in server.scopes.' + me.client);
  }
  return me;
}

function may(scope) {
  return Boolean(view.me && view.me.scopes.includes(scope));
}

function login(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
  view.me = null;
  start();
}

function logout() {
  sessionStorage.removeItem(TOKEN_KEY);
  view.me = null;
  showLogin('logged out');
}

// --- the runs ----------------------------------------------------------------------

// A run summary's progress: steps done of those planned so far.
function progress(run) {
  const done = run.steps_done;
  const total = run.steps_total;
  const pct = total ? Math.round((100 * done) / total) : 100;
  return el('span', { class: 'progress', title: done + ' of ' + total + ' steps' },
    el('span', { class: 'bar' }, el('span', { 'data-pct': pct })), ' ', done + '/' + total);
}

function fillBars(root) {
  // Widths are set from script: the Content-Security-Policy allows no inline style.
  for (const span of root.querySelectorAll('[data-pct]')) span.style.width = span.dataset.pct + '%';
}

function renderRuns() {
  const rows = view.runs.map((run) => el('tr', { 'data-run-id': run.id },
    el('td', {}, el('a', { href: '#/runs/' + encodeURIComponent(run.id), class: 'run-link' }, run.id)),
    el('td', { class: 'hide-narrow' }, run.kind),
    el('td', {}, run.target || ''),
    el('td', {}, el('span', { class: 'status status-' + run.status }, run.status)),
    el('td', {}, progress(run)),
    el('td', { class: 'hide-narrow muted' }, time(run.updated_at))));
  const table = el('div', { class: 'scroll' }, el('table', { id: 'runs' },
    el('thead', {}, el('tr', {}, el('th', {}, 'run'), el('th', { class: 'hide-narrow' }, 'kind'), el('th', {}, 'target'),
      el('th', {}, 'status'), el('th', {}, 'progress'), el('th', { class: 'hide-narrow' }, 'updated'))),
    el('tbody', {}, rows)));
  show(el('h1', {}, 'Runs'), rows.length ? table : el('p', { class: 'muted' }, 'No runs yet.'),
    el('h2', {}, 'Gate'), el('div', { id: 'gate', class: 'panel' }));
  fillBars(document.getElementById('main'));
  renderGatePanel();
}

async function loadRuns() {
  view.runs = await api('/v1/runs?limit=200&view=summary');
  if (route().page === 'runs') renderRuns();
}

// --- one run -----------------------------------------------------------------------

const STATE_OF_STEP = {
  gate: 'gated', drain: 'draining', upgrade: 'upgrading', apply: 'upgrading', verify: 'upgrading',
  uncordon: 'upgrading', 'healthy-before': 'gated', 'healthy-after': 'upgrading', 'move-leader': 'upgrading',
  containerd: 'upgrading', 'apt-repo': 'upgrading', 'kubeadm-plan': 'checking', soak: 'soaking',
  'etcd-gate': 'gated', 'etcd-restart': 'upgrading', 'etcd-ready': 'upgrading', 'etcd-transfer': 'upgrading',
  'etcd-cooldown': 'soaking', restart: 'upgrading', ready: 'upgrading', transfer: 'upgrading', cooldown: 'soaking',
  fetch: 'upgrading', required: 'checking', reboot: 'rebooting', back: 'rebooting',
};

// What a node (or etcd member) is doing, from its steps in one stage.
function nodeState(steps) {
  if (steps.every((s) => s.status === 'done')) return 'done';
  if (steps.every((s) => s.status === 'pending')) return 'waiting';
  const next = steps.find((s) => s.status !== 'done');
  return STATE_OF_STEP[next.name] || 'working';
}

function stages(run) {
  const order = [];
  const byStage = new Map();
  for (const step of run.steps || []) {
    if (!byStage.has(step.stage)) { byStage.set(step.stage, []); order.push(step.stage); }
    byStage.get(step.stage).push(step);
  }
  return order.map((stage) => {
    const steps = byStage.get(stage);
    const nodes = [];
    const byNode = new Map();
    for (const step of steps.filter((s) => s.node)) {
      if (!byNode.has(step.node)) { byNode.set(step.node, []); nodes.push(step.node); }
      byNode.get(step.node).push(step);
    }
    return { stage, steps, nodes: nodes.map((name) => ({ name, steps: byNode.get(name) })), batches: batches(steps) };
  });
}

// A stage's batches of workers: each begins at a gate, its nodes those drained after it.
function batches(steps) {
  const out = [];
  for (const step of steps) {
    if (step.name === 'gate') out.push([]);
    else if (step.name === 'drain' && out.length) out[out.length - 1].push(step.node);
  }
  return out.filter((b) => b.length);
}

function nodeRow(n) {
  const state = nodeState(n.steps);
  const started = n.steps.map((s) => s.started_at).filter(Boolean).sort()[0];
  const ended = state === 'done' ? n.steps.map((s) => s.ended_at).filter(Boolean).sort().pop() : null;
  return el('div', { class: 'node', 'data-node': n.name },
    el('span', { class: 'name' }, n.name),
    el('span', { class: 'state state-' + state }, state),
    el('span', { class: 'times' }, started ? time(started) + (ended ? ' – ' + time(ended) : ' –') : ''));
}

// Nodes grouped by batch: a batch in hand is open, the others say how far they got.
function batchedNodes(nodes, groups) {
  const byName = new Map(nodes.map((n) => [n.name, n]));
  return el('div', { class: 'batches' }, groups.map((names, i) => {
    const members = names.map((name) => byName.get(name)).filter(Boolean);
    const states = members.map((n) => nodeState(n.steps));
    const done = states.filter((st) => st === 'done').length;
    const waiting = states.filter((st) => st === 'waiting').length;
    const inHand = members.length - done - waiting;
    const details = el('details', { class: 'batch', 'data-batch': String(i + 1) },
      el('summary', {}, 'batch ' + (i + 1) + ' (' + members.length + ' node' + (members.length === 1 ? '' : 's') + '): ',
        el('span', { class: 'batch-counts' }, done + ' done, ' + inHand + ' in hand, ' + waiting + ' waiting')),
      el('div', { class: 'nodes' }, members.map(nodeRow)));
    if (inHand > 0) details.open = true;
    return details;
  }));
}

// How long ago `iso` was, for a person: 45s, 12m, 3h 5m, 2d 4h.
function age(iso) {
  const secs = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (!Number.isFinite(secs)) return '';
  if (secs < 60) return secs + 's';
  const mins = Math.floor(secs / 60);
  if (mins < 60) return mins + 'm';
  const hours = Math.floor(mins / 60);
  if (hours < 48) return hours + 'h' + (mins % 60 ? ' ' + (mins % 60) + 'm' : '');
  return Math.floor(hours / 24) + 'd' + (hours % 24 ? ' ' + (hours % 24) + 'h' : '');
}

// A blocker in a few words: its name and, when known, how long it has held.
function blockerBrief(b) {
  return b.name + (b.since ? ' (' + age(b.since) + ')' : '');
}

function renderGatePanel() {
  const gate = view.gate;
  const summary = document.getElementById('gate-summary');
  if (summary) {
    // The verdict never shows without why: the blockers, or what could not be read.
    const v = gate && gate.verdict;
    const why = !v ? '' : (v.blockers || []).length ? ': ' + v.blockers.map(blockerBrief).join(', ')
      : v.reason ? ': ' + v.reason : '';
    summary.textContent = v ? 'gate ' + v.verdict + why : '';
  }
  const panel = document.getElementById('gate');
  if (!panel) return;
  if (!gate) { panel.replaceChildren(el('p', { class: 'muted' }, 'The gate has not been asked yet.')); return; }
  const v = gate.verdict;
  const items = (v.blockers || []).map((b) => el('li', { class: 'blocker' },
    el('strong', { class: 'blocker-name' }, b.name), ' (' + b.source + (b.since ? ', since ' + time(b.since) + ', ' + age(b.since) + ' ago' : '') + ') ',
    el('span', { class: 'labels' }, Object.entries(b.labels || {}).map(([k, val]) => k + '=' + val).join(', '))));
  panel.replaceChildren(...present([
    el('p', {}, 'Gate now: ', el('span', { id: 'gate-verdict', class: 'status verdict-' + v.verdict }, v.verdict),
      v.reason ? ' — ' + v.reason : '', el('span', { class: 'muted' }, ' (asked ' + time(gate.evaluated_at) + ')')),
    items.length ? el('ul', { id: 'blockers', class: 'blockers' }, items) : null]));
}

async function control(action) {
  const reason = 'from the status page';
  try {
    await api('/v1/runs/' + encodeURIComponent(view.run.id) + '/' + action, { method: 'POST', body: JSON.stringify({ reason }) });
  } catch (e) {
    if (e instanceof AuthError) { showLogin(e.message); return; }
    document.getElementById('control-error').textContent = action + ': ' + e.message;
  }
  scheduleRefresh();
}

// Above this many workers, the workers stage shows them grouped by batch.
const GROUP_ABOVE = 50;

// How many of a run's newest transitions the history table shows.
const HISTORY_SHOWN = 200;

// A run held at its fleet wave's `upstreams` step: how this rollgate sees each upstream,
// and the approval it waits for.
function waitsForUpstreams(run) {
  return (run.steps || []).some((s) => s.name === 'upstreams' && s.status !== 'done' && s.status !== 'pending');
}

// The step that waits for an approval says so first in its outcome (the engine's rule).
// At each poll it runs again with that outcome still on it: the button stays meanwhile,
// rather than vanish from under a click several times a second.
function awaitsApproval(run) {
  return (run.steps || []).some((s) => ['waiting', 'running'].includes(s.status) && (s.outcome || '').startsWith('waits for approval'));
}

async function loadFleet() {
  const panel = document.getElementById('fleet');
  if (!panel) return;
  let fleet;
  try {
    fleet = await api('/v1/fleet');
  } catch (e) {
    panel.replaceChildren(el('p', { class: 'reason' }, 'The fleet cannot be read: ' + e.message));
    return;
  }
  const items = (fleet.upstreams || []).map((u) => el('li', { class: 'upstream', 'data-upstream': u.name },
    el('strong', {}, u.name), ' ',
    el('span', { class: 'status ' + (u.ready ? 'status-succeeded' : 'status-waiting') }, u.ready ? 'ready' : 'holds'),
    u.soak_remaining_secs ? el('span', { class: 'muted' }, ' soak left ' + u.soak_remaining_secs + 's') : null,
    u.blockers.length ? el('ul', {}, u.blockers.map((b) => el('li', { class: 'reason' }, b))) : null));
  panel.replaceChildren(el('p', {}, 'This cluster: ' + fleet.name + '; its upstreams, asked ' + time(new Date().toISOString()) + ':'),
    el('ul', { class: 'blockers' }, items));
}

// --- batch analyses -----------------------------------------------------------------

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Every analysis step's findings, numbered by batch in plan order.
function analysesOf(run) {
  const out = [];
  let batch = 0;
  for (const step of run.steps || []) {
    if (step.name !== 'analysis') continue;
    batch += 1;
    for (const finding of step.findings || []) out.push({ step, batch, finding });
  }
  return out;
}

function fixed(x, digits) {
  return x === null || x === undefined ? '∞' : Number(x).toFixed(digits);
}

const PICTURE = { width: 320, height: 150, top: 14, bottom: 20, left: 44 };

// One finding as a picture: each group's changes (after / before) as dots, one per node,
// on a log scale, its median as a bar, the baseline's median moved by the tolerance as a
// dashed line, and no change (1.0) as a faint one. An infinite change sits on the top edge.
function findingPicture(f) {
  const groups = [
    { key: 'canary', label: 'batch', figures: f.canary, x: 130 },
    { key: 'baseline', label: 'comparison', figures: f.baseline, x: 250 },
  ];
  const finite = groups.flatMap((g) => g.figures.changes).filter((c) => c !== null && c > 0);
  const bound = f.baseline.median ? (f.direction === 'decrease' ? f.baseline.median / f.tolerance : f.baseline.median * f.tolerance) : null;
  const span = finite.concat([1, bound].filter((v) => v !== null && v > 0));
  const lo = Math.log(Math.min(...span)) - 0.05;
  const hi = Math.log(Math.max(...span)) + 0.05;
  const { width, height, top, bottom, left } = PICTURE;
  const y = (v) => (v === null ? top : v <= 0 ? height - bottom
    : top + (hi - Math.log(v)) / (hi - lo) * (height - top - bottom));
  const level = (v, cls, label) => [
    svg('line', { class: cls, x1: left, x2: width - 6, y1: y(v), y2: y(v) }),
    svg('text', { class: 'tick', x: left - 4, y: y(v) + 4, 'text-anchor': 'end' }, label || fixed(v, 2))];
  const parts = [level(1, 'no-change')];
  if (bound) parts.push(level(bound, 'tolerance', fixed(bound, 2)));
  for (const g of groups) {
    const changes = g.figures.changes;
    const dots = changes.map((c, i) => {
      const dx = (i % 5 - 2) * 7;
      return svg('circle', { class: 'dot dot-' + g.key + (c === null ? ' dot-infinite' : ''), cx: g.x + dx, cy: y(c), r: 4 },
        svg('title', {}, g.figures.nodes[i] + ': ' + fixed(c, 3)));
    });
    const median = g.figures.median !== null && g.figures.median !== undefined
      ? svg('line', { class: 'median median-' + g.key, x1: g.x - 22, x2: g.x + 22, y1: y(g.figures.median), y2: y(g.figures.median) })
      : null;
    parts.push(svg('g', { class: 'group', 'data-group': g.key, 'data-nodes': changes.length },
      dots, median,
      svg('text', { class: 'group-label', x: g.x, y: height - 4, 'text-anchor': 'middle' }, g.label + ' (' + changes.length + ')')));
  }
  return svg('svg', { class: 'analysis-picture', viewBox: '0 0 ' + width + ' ' + height, width, height, role: 'img',
    'aria-label': f.analysis + ': ' + f.verdict }, parts);
}

// A finding's verdict and figures in words, beside its picture.
function findingWords(f) {
  const group = (name, g) => el('li', {}, name + ': ' + g.nodes.length + ' node' + (g.nodes.length === 1 ? '' : 's')
    + (g.nodes.length ? ', median change ' + fixed(g.median, 3) : ''));
  return el('div', { class: 'finding-words' },
    el('p', {}, el('strong', {}, f.analysis), ' ',
      el('span', { class: 'status verdict-' + f.verdict, 'data-verdict-word': f.verdict }, f.verdict)),
    f.why ? el('p', { class: 'reason' }, f.why)
      : el('p', { class: 'effect' }, 'effect ' + fixed(f.effect, 2) + ' (tolerance ' + f.tolerance + ', ' + f.direction + ' is bad), p = ' + fixed(f.p_value, 4)),
    el('ul', { class: 'groups' }, group('batch', f.canary), group('comparison', f.baseline)));
}

function renderAnalyses(run) {
  const found = analysesOf(run);
  if (!found.length) return null;
  return el('div', { id: 'analyses' }, found.map(({ step, batch, finding }) => el('figure',
    { class: 'analysis verdict-box-' + finding.verdict, 'data-analysis': finding.analysis, 'data-verdict': finding.verdict, 'data-batch': batch },
    el('figcaption', {}, 'batch ' + batch + ' (' + step.stage + '/analysis@' + step.node + ')'),
    el('div', { class: 'finding' }, findingPicture(finding), findingWords(finding)))));
}

function renderRun() {
  const run = view.run;
  const terminal = ['succeeded', 'failed', 'aborted'].includes(run.status);
  // A token without runs:control sees the controls but cannot use them, and is told why.
  const controlling = may('runs:control');
  const denied = controlling ? null : 'client ' + view.me.client + ' lacks scope runs:control';
  const button = (id, label, off) => el('button', { id, type: 'button', disabled: off || !controlling, title: denied, onclick: () => control(id) }, label);
  const controls = el('div', { class: 'controls' },
    button('halt', 'Halt', terminal || run.status === 'halted'),
    button('resume', 'Resume', run.status !== 'halted'),
    button('abort', 'Abort', terminal),
    awaitsApproval(run)
      ? el('button', { id: 'approve', type: 'button', disabled: !may('runs:approve'), title: may('runs:approve') ? null : 'client ' + view.me.client + ' lacks scope runs:approve', onclick: () => control('approve') }, 'Approve')
      : null,
    el('span', { id: 'control-error', class: 'reason' }, denied ? denied + ': read only' : ''));
  const timeline = stages(run).map(({ stage, steps, nodes, batches: groups }) => {
    const done = steps.filter((s) => s.status === 'done').length;
    let body;
    if (stage === 'workers' && groups.length > 1 && nodes.length > GROUP_ABOVE) body = batchedNodes(nodes, groups);
    else if (nodes.length) body = el('div', { class: 'nodes' }, nodes.map(nodeRow));
    else body = el('p', { class: 'muted' }, steps.map((s) => s.name + ' ' + s.status).join(' · '));
    return el('section', { class: 'stage', 'data-stage': stage }, el('h3', {}, stage + ' ', el('span', { class: 'muted' }, done + '/' + steps.length)), body);
  });
  const history = [...(run.history || [])].reverse().map((h) => el('tr', {},
    el('td', { class: 'muted' }, time(h.at)), el('td', {}, h.to), el('td', {}, h.step || ''),
    el('td', { class: 'by' }, h.by || ''), el('td', {}, h.reason)));
  show(
    el('h1', {}, run.kind + (run.target ? ' ' + run.target : '') + ' — ', el('span', { id: 'run-status', class: 'status status-' + run.status }, run.status)),
    el('p', { id: 'run-id', class: 'muted' }, run.id),
    el('p', { id: 'run-reason' }, run.reason),
    run.blockers && run.blockers.length ? el('p', { id: 'run-blockers', class: 'reason' }, 'Held by: ' + run.blockers.join('; ')) : null,
    controls,
    waitsForUpstreams(run) ? el('h2', {}, 'Fleet') : null,
    waitsForUpstreams(run) ? el('div', { id: 'fleet', class: 'panel' }, el('p', { class: 'muted' }, 'Asking…')) : null,
    el('h2', {}, 'Gate'),
    el('div', { id: 'gate', class: 'panel' }),
    el('h2', {}, 'Stages'),
    el('div', { id: 'timeline' }, timeline),
    analysesOf(run).length ? el('h2', {}, 'Batch analyses') : null,
    renderAnalyses(run),
    el('h2', {}, 'History'),
    el('div', { class: 'scroll' }, el('table', { id: 'history' },
      el('thead', {}, el('tr', {}, el('th', {}, 'at'), el('th', {}, 'to'), el('th', {}, 'step'), el('th', {}, 'by'), el('th', {}, 'why'))),
      el('tbody', {}, history))));
  renderGatePanel();
  if (waitsForUpstreams(run)) loadFleet();
}

async function loadRun(id) {
  // Every step (the timeline), the newest transitions (the history table).
  view.run = await api('/v1/runs/' + encodeURIComponent(id) + '?history_last=' + HISTORY_SHOWN);
  if (route().page === 'run' && route().id === id) renderRun();
}

// --- routing, refreshing and the event stream --------------------------------------------

function route() {
  const m = location.hash.match(/^#\/runs\/(.+)$/);
  return m ? { page: 'run', id: decodeURIComponent(m[1]) } : { page: 'runs' };
}

async function refresh() {
  const r = route();
  try {
    if (r.page === 'run') await loadRun(r.id);
    else await loadRuns();
  } catch (e) {
    if (e instanceof AuthError) showLogin(e.message);
    else show(el('p', { class: 'reason' }, e.message));
  }
}

function scheduleRefresh() {
  clearTimeout(view.refresh);
  view.refresh = setTimeout(refresh, 150);
}

function setLive(on) {
  const live = document.getElementById('live');
  live.textContent = on ? 'live' : 'offline';
  live.className = on ? 'live' : 'live off';
}

function handleFrame(frame) {
  if (frame.event === 'transition') {
    if (frame.id) view.lastEventId = frame.id;
    const event = JSON.parse(frame.data);
    const r = route();
    if (r.page === 'runs' || (r.page === 'run' && r.id === event.run_id)) scheduleRefresh();
  } else if (frame.event === 'gate') {
    view.gate = JSON.parse(frame.data);
    renderGatePanel();
  }
}

function parseFrame(raw) {
  const frame = { event: 'message', data: [], id: null };
  for (const line of raw.split('\n')) {
    const at = line.indexOf(':');
    if (at === 0) continue;
    const field = at < 0 ? line : line.slice(0, at);
    const value = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
    if (field === 'event') frame.event = value;
    else if (field === 'data') frame.data.push(value);
    else if (field === 'id') frame.id = value;
  }
  frame.data = frame.data.join('\n');
  return frame;
}

function stopStream() {
  if (view.stream) view.stream.abort();
  view.stream = null;
  setLive(false);
}

// fetch, not EventSource: EventSource cannot send the Authorization header.
async function runStream() {
  const controller = new AbortController();
  view.stream = controller;
  while (!controller.signal.aborted) {
    try {
      const headers = { Authorization: 'Bearer ' + token() };
      if (view.lastEventId) headers['Last-Event-ID'] = view.lastEventId;
      const res = await fetch('/v1/events', { headers, signal: controller.signal });
      if (res.status === 401) { showLogin('the token was refused (401 Unauthorized): check it and log in again'); return; }
      if (res.ok) {
        setLive(true);
        // Whatever happened while the stream was down is in the API.
        scheduleRefresh();
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const raw = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            handleFrame(parseFrame(raw));
          }
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

async function start() {
  if (!view.me) {
    try {
      view.me = await whoami();
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(e instanceof AuthError ? e.message : 'rollgate does not answer: ' + e.message);
      return;
    }
  }
  // server.banner: e.g. that this is a local sandbox, not a real cluster.
  const banner = document.getElementById('banner');
  banner.textContent = view.me.banner || '';
  banner.hidden = !view.me.banner;
  const who = document.getElementById('who');
  who.textContent = view.me.client + (may('runs:control') ? '' : ' (read only)');
  who.hidden = false;
  document.getElementById('logout').hidden = false;
  api('/v1/gates?cached=true').then((g) => { view.gate = g; renderGatePanel(); }).catch(() => {});
  refresh();
  stopStream();
  runStream();
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('logout').addEventListener('click', logout);
  window.addEventListener('hashchange', refresh);
  if (token()) start();
  else showLogin('');
});
