// The quota console: plain JavaScript, no build step. Every page is drawn from the JSON API
// under /console/api/ and drawn again every POLL_MS while it is shown. Text from the server
// is only ever set as textContent, never parsed as HTML.
'use strict';

const POLL_MS = 1500;
const state = { session: null, timer: null, busy: false, page: null };

class APIError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || ('HTTP ' + status));
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

async function api(method, path, body) {
  const headers = { 'Accept': 'application/json' };
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (method === 'POST') {
    headers['Content-Type'] = 'application/json';
    if (state.session && state.session.csrf) headers['X-CSRF-Token'] = state.session.csrf;
    init.body = JSON.stringify(body || {});
  }
  const resp = await fetch('/console/api/' + path, init);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}

// el makes an element: attrs sets properties (class, dataset entries as data-*), children
// are nodes or text.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith('data-') && v !== undefined && v !== null) e.setAttribute(k, String(v));
    else if (v === undefined || v === null || v === false) continue;
    else if (k === 'class') e.className = v;
    else if (k === 'onclick') e.addEventListener('click', v);
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function status(msg, isError) {
  const s = document.getElementById('status');
  s.textContent = msg || '';
  s.className = isError ? 'error' : '';
}

function duration(sec) {
  if (sec === null || sec === undefined) return '—';
  if (sec < 60) return sec.toFixed(0) + ' s';
  if (sec < 3600) return (sec / 60).toFixed(1) + ' min';
  if (sec < 86400) return (sec / 3600).toFixed(1) + ' h';
  return (sec / 86400).toFixed(1) + ' d';
}

function flag(text, kind) { return el('span', { class: 'flag ' + (kind || '') }, text); }

function showLogin(message) {
  stopPolling();
  const main = document.getElementById('main');
  main.replaceChildren(document.getElementById('login-form').content.cloneNode(true));
  status(message || '', !!message);
  document.getElementById('login').addEventListener('click', async () => {
    try {
      state.session = await api('POST', 'login', { token: document.getElementById('token').value.trim() });
      status('');
      showWho();
      route();
    } catch (e) {
      status('login refused: ' + e.message, true);
    }
  });
}

function showWho() {
  const s = state.session;
  document.getElementById('who').textContent = s.insecure ? 'no login (--insecure)' : (s.name + ' (' + s.role + ')');
  document.getElementById('who').dataset.role = s.role;
  document.getElementById('logout').hidden = s.insecure;
  const banner = document.getElementById('banner');
  banner.hidden = !s.insecure;
  banner.textContent = s.insecure
    ? 'Running --insecure: there is no login; anyone who reaches this port acts as an operator.' : '';
}

async function logout() {
  try { await api('POST', 'logout'); } catch (e) { /* the session is gone either way */ }
  state.session = null;
  document.getElementById('who').textContent = '';
  document.getElementById('logout').hidden = true;
  showLogin('');
}

function stopPolling() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

function route() {
  stopPolling();
  const m = location.hash.match(/^#\/sale\/([A-Za-z0-9_.:-]+)$/);
  state.page = m ? () => drawSale(decodeURIComponent(m[1])) : drawOverview;
  refresh();
  state.timer = setInterval(refresh, POLL_MS);
}

async function refresh() {
  if (state.busy || !state.page) return;
  state.busy = true;
  try {
    await state.page();
  } catch (e) {
    if (e.status === 401) { state.session = null; showLogin('your session has ended: log in again'); }
    else status(e.message, true);
  } finally {
    state.busy = false;
  }
}

// clusterStatus is the front page's summary of GET api/status (what quotactl status prints):
// what needs a person, then one line per region and per etcd member.
function clusterStatus(st) {
  if (st instanceof Error) return el('p', { id: 'cluster' }, flag('cluster status unavailable: ' + st.message, 'warn'));
  const problems = st.problems.length
    ? el('ul', { id: 'problems' }, st.problems.map(p => el('li', {}, flag('needs a person', 'bad'), ' ', p)))
    : el('p', { id: 'problems' }, flag('nothing needs a person', 'ok'));
  const regions = st.regions.map(r => el('li', { 'data-region': r.name }, 'region ', r.name, ': ',
    r.leader ? 'leader ' + r.leader + ' (epoch ' + r.epoch + ')' : flag('nobody leads', 'bad'),
    ', ' + (r.processes.length - (r.leader ? 1 : 0)) + ' standby, database ' + r.database));
  const etcd = st.etcd.map(m => el('li', {}, 'etcd ', m.name || m.endpoint, ': ',
    m.healthy ? flag(m.raft_leader ? 'healthy, raft leader' : 'healthy', 'ok') : flag('not healthy', 'bad')));
  return el('section', { id: 'cluster' }, el('h2', {}, 'Cluster'), problems,
    el('p', {}, 'coordinator leader ' + (st.coordinator_leader || 'none') + ' (generation ' + st.generation + '), ' +
      st.coordinators.length + ' coordinators; transfers unfinished ' + st.unfinished_transfers + ', stranded ' +
      st.stranded_transfers + '; pauses ' + st.paused),
    el('ul', {}, regions, etcd));
}

async function drawOverview() {
  const [o, st] = await Promise.all([api('GET', 'overview'), api('GET', 'status').catch(e => e)]);
  const rows = o.sales.map(s => el('tr', { class: 'sale', 'data-sale': s.sale },
    el('td', {}, el('a', { href: '#/sale/' + encodeURIComponent(s.sale) }, s.sale)),
    el('td', { class: 'num' }, s.skus), el('td', { class: 'num' }, s.total), el('td', { class: 'num' }, s.unallocated),
    el('td', {}, s.paused > 0 ? flag('paused', 'warn') : ''),
    el('td', {}, new Date(s.created_at).toLocaleString())));
  const audit = o.continuous_audit;
  document.getElementById('main').replaceChildren(
    clusterStatus(st),
    el('h2', {}, 'Sales'),
    el('p', {}, o.leading ? flag('this coordinator leads', 'ok') : flag('standby: changes go to the leader', 'warn'),
      ' continuous audit: ', audit.at ? (audit.violations === 0 ? flag('clean', 'ok') : flag(audit.violations + ' violations', 'bad'))
        : flag('no round yet'), audit.at ? ' at ' + new Date(audit.at).toLocaleTimeString() : ''),
    rows.length ? el('table', { id: 'sales' }, el('tr', {}, el('th', {}, 'sale'), el('th', { class: 'num' }, 'SKUs'),
      el('th', { class: 'num' }, 'total'), el('th', { class: 'num' }, 'unallocated'), el('th', {}, ''), el('th', {}, 'created')), rows)
      : el('p', { class: 'muted' }, 'No sales yet (quotactl sale create).'),
    el('h2', {}, 'Last audit rounds'), roundsTable(o.rounds));
  status('updated ' + new Date().toLocaleTimeString());
}

function roundsTable(rounds) {
  if (!rounds.length) return el('p', { class: 'muted' }, 'No round stored yet (quotactl audit history).');
  return el('table', { id: 'rounds' }, el('tr', {}, ['round', 'at', 'result', 'evidence'].map(h => el('th', {}, h))),
    rounds.map(r => el('tr', { class: 'round', 'data-ok': r.ok },
      el('td', { class: 'num' }, r.round_id), el('td', {}, new Date(r.at).toLocaleTimeString()),
      el('td', {}, r.error ? flag('could not run', 'bad') : (r.ok ? flag(r.skus + ' SKUs ok', 'ok') : flag(r.violations.length + ' violations', 'bad'))),
      el('td', { class: 'evidence' }, r.error || r.violations.map(v => v.invariant + ' ' + v.sku + (v.region ? ' ' + v.region : '') + ': ' + v.evidence).join('; ')))));
}

function poolRow(sku, p) {
  const total = p.available + p.held + p.sold;
  const bar = el('div', { class: 'bar', title: p.available + ' available, ' + p.held + ' held, ' + p.sold + ' sold' });
  for (const part of ['available', 'held', 'sold']) {
    const seg = el('span', { class: part });
    seg.style.width = (total > 0 ? 100 * p[part] / total : 0) + '%';
    bar.append(seg);
  }
  return el('tr', { class: 'pool', 'data-sku': sku.sku, 'data-region': p.region },
    el('td', {}, p.region), el('td', {}, bar),
    el('td', { class: 'num available' }, p.available), el('td', { class: 'num held' }, p.held),
    el('td', { class: 'num sold' }, p.sold), el('td', { class: 'num demand' }, p.demand_per_sec.toFixed(1)),
    el('td', { class: 'num empty' }, duration(p.empty_in_sec)),
    el('td', {}, p.exhausted ? flag('exhausted', 'warn') : ''));
}

function skuSection(sku) {
  return el('section', { class: 'sku', 'data-sku': sku.sku },
    el('h3', {}, sku.sku, ' ', sku.sold_out ? flag('sold out', 'bad') : '', sku.paused ? flag('paused', 'warn') : '',
      el('span', { class: 'muted' }, ' total ' + sku.total + ', unallocated ' + sku.unallocated)),
    el('table', {}, el('tr', {}, el('th', {}, 'region'), el('th', { class: 'legend' }, 'pool',
      el('span', { class: 'available' }), 'available', el('span', { class: 'held' }), 'held', el('span', { class: 'sold' }), 'sold'),
    el('th', { class: 'num' }, 'available'), el('th', { class: 'num' }, 'held'), el('th', { class: 'num' }, 'sold'),
    el('th', { class: 'num' }, 'demand/s'), el('th', { class: 'num' }, 'empty in'), el('th', {}, '')),
    sku.pools.map(p => poolRow(sku, p))));
}

function transferRow(t) {
  const can = state.session.can_change && t.open;
  return el('tr', { class: 'transfer' + (t.stranded ? ' stranded' : ''), 'data-id': t.id, 'data-stranded': t.stranded, 'data-state': t.state },
    el('td', {}, t.stranded ? flag('stranded', 'bad') : '', t.state, t.state === 'posted' && !t.settled ? ' (unsettled)' : ''),
    el('td', { class: 'id' }, t.id), el('td', {}, t.sku), el('td', {}, t.from + ' → ' + t.to),
    el('td', { class: 'num' }, t.units), el('td', { class: 'num age' }, duration(t.age_sec)),
    el('td', { class: 'reason' }, t.reason),
    el('td', {}, can ? el('button', { class: 'action resolve', 'data-id': t.id, onclick: () => resolve(t.id, false) }, 'resolve') : '',
      can ? el('button', { class: 'action refuse', 'data-id': t.id, onclick: () => resolve(t.id, true) }, 'refuse') : ''));
}

function planSection(p) {
  const can = state.session.can_change && p.moves.length > 0;
  const notes = [];
  if (p.mode) notes.push(flag('rebalance ' + p.mode + (p.auto_rebalance ? '' : ' (off on this coordinator)'), p.mode === 'auto' && p.auto_rebalance ? 'ok' : ''));
  if (p.near_sell_out) notes.push(flag('near sell-out', 'warn'));
  if (p.in_flight) notes.push(flag(p.in_flight + ' in flight', ''));
  return el('div', { class: 'plan', 'data-sku': p.sku },
    el('h3', {}, p.sku || 'plan', ' ', notes, can ? el('button', { class: 'action apply', 'data-sku': p.sku, onclick: () => apply(p.sku) }, 'apply now') : ''),
    p.error ? el('p', { class: 'error' }, p.error) : '',
    el('table', {}, el('tr', {}, el('th', {}, 'pool'), el('th', { class: 'num' }, 'available'), el('th', { class: 'num' }, 'on its way'),
      el('th', { class: 'num' }, 'reserved in the window'), el('th', { class: 'num' }, 'per second'), el('th', { class: 'num' }, 'needs'),
      el('th', { class: 'num' }, 'empty in')),
    p.pools.map(d => el('tr', {}, el('td', {}, d.pool, d.frozen ? ' ' : '', d.frozen ? flag('frozen: a stranded transfer left it', 'bad') : ''),
      el('td', { class: 'num' }, d.available), el('td', { class: 'num' }, d.incoming), el('td', { class: 'num' }, d.recent),
      el('td', { class: 'num' }, d.per_second.toFixed(1)), el('td', { class: 'num' }, d.need), el('td', { class: 'num' }, duration(d.empty_in_sec))))),
    el('p', {}, p.moves.length ? 'Next: ' + p.moves.map(m => m.units + ' ' + m.from + ' → ' + m.to).join(', ') : 'Nothing to move.'),
    p.held ? el('p', { class: 'muted held' }, 'Held back: ' + p.held) : '');
}

function auditSection(a) {
  if (!a) return el('p', { class: 'muted' }, 'Audit not run yet.');
  const head = a.error ? flag('audit failed: ' + a.error, 'bad') : (a.ok ? flag('conservation holds', 'ok') : flag(a.violations.length + ' violations', 'bad'));
  return el('div', { id: 'audit', 'data-ok': a.ok },
    el('p', {}, head, a.at ? ' audited ' + new Date(a.at).toLocaleTimeString() : '',
      ' — continuous audit: ', a.continuous.at ? a.continuous.violations + ' violations at ' + new Date(a.continuous.at).toLocaleTimeString() : 'no round yet'),
    a.violations.length ? el('table', { class: 'violations' }, el('tr', {}, el('th', {}, 'invariant'), el('th', {}, 'SKU'),
      el('th', {}, 'region'), el('th', {}, 'evidence')),
    a.violations.map(v => el('tr', { class: 'violation' }, el('td', {}, v.invariant), el('td', {}, v.sku), el('td', {}, v.region),
      el('td', { class: 'evidence' }, v.evidence)))) : '',
    (a.skus || []).length ? el('table', {}, el('tr', {}, ['SKU', 'total', 'unallocated', 'available', 'held', 'sold', 'in flight', 'stranded', '']
      .map(h => el('th', {}, h))), a.skus.map(k => el('tr', {}, el('td', {}, k.sku),
      [k.total, k.unallocated, k.available, k.held, k.sold, k.in_flight, k.stranded].map(n => el('td', { class: 'num' }, n)),
      el('td', {}, k.ok ? flag('I1 ok', 'ok') : flag('I1 broken', 'bad'))))) : '');
}

async function drawSale(sale) {
  const v = await api('GET', 'sales/' + encodeURIComponent(sale));
  const stranded = v.transfers.filter(t => t.stranded).length;
  document.getElementById('main').replaceChildren(...[
    el('p', {}, el('a', { href: '#/' }, '← sales')),
    el('h2', { id: 'sale', 'data-sale': v.sale }, 'Sale ' + v.sale),
    el('p', { class: 'muted' }, 'per-user limit ' + v.per_user_limit + '; opens ' + new Date(v.opens_at).toLocaleString() +
      '; demand measured over the last ' + v.demand_window_sec + ' s'),
    (v.pauses || []).map(p => el('p', {}, flag('paused', 'warn'), (p.sku || 'the whole sale') + ': ' + p.reason)),
    v.errors.map(e => el('p', { class: 'error' }, flag('unreadable', 'bad'), e)),
    el('h2', {}, 'Pools'), (v.skus || []).map(skuSection),
    el('h2', {}, 'Transfers ', stranded ? flag(stranded + ' stranded', 'bad') : ''),
    v.transfers.length ? el('table', { id: 'transfers' }, el('tr', {}, ['state', 'id', 'SKU', 'from → to', 'units', 'age', 'reason', '']
      .map(h => el('th', {}, h))), v.transfers.map(transferRow)) : el('p', { class: 'muted' }, 'No transfers.'),
    el('h2', {}, 'Rebalancer plan'), v.plans.map(planSection),
    el('h2', {}, 'Audit'), auditSection(v.audit)].flat());
  status('updated ' + new Date(v.at).toLocaleTimeString());
}

async function act(what, fn) {
  status(what + '…');
  try {
    const msg = await fn();
    status(msg);
  } catch (e) {
    status(what + ' refused: ' + e.message, true);
  }
  refresh();
}

function resolve(id, refuse) {
  act((refuse ? 'refusing ' : 'resolving ') + id, async () => {
    const t = await api('POST', 'transfers/' + encodeURIComponent(id) + '/resolve', { refuse });
    return 'transfer ' + t.id + ' is ' + t.state + (t.stranded ? ' (still stranded: ' + t.reason + ')' : '');
  });
}

function apply(sku) {
  const sale = document.getElementById('sale').dataset.sale;
  const rid = Array.from(crypto.getRandomValues(new Uint8Array(12)), b => b.toString(16).padStart(2, '0')).join('');
  act('applying the plan of ' + sku, async () => {
    const r = await api('POST', 'sales/' + encodeURIComponent(sale) + '/rebalance', { sku, request_id: rid });
    return r.transfers.length + ' transfers made: ' + r.transfers.map(t => t.units + ' ' + t.from + ' → ' + t.to + ' ' + t.state).join(', ');
  });
}

async function start() {
  document.getElementById('logout').addEventListener('click', logout);
  window.addEventListener('hashchange', () => { if (state.session) route(); });
  try {
    state.session = await api('GET', 'session');
  } catch (e) {
    if (e.status === 401) { showLogin(''); return; }
    status(e.message, true);
    return;
  }
  showWho();
  route();
}

start();
