// The gnomon console: a single page over the REST API (/v1), no framework,
// no network beyond this server. Views are chosen by the URL's #fragment.
'use strict';

const S = {
  token: sessionStorage.getItem('gnomon.token') || '',
  me: null,
  leader: null,
  timer: null,
  delay: 3000,
  view: null,
  editing: false,
};
const ROLES = { viewer: 1, operator: 2, admin: 3 };
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled', 'skipped']);
const OUTCOMES = ['succeeded', 'failed', 'cancelled', 'skipped'];
const COLORS = { succeeded: '#1f8a4c', failed: '#c0392b', cancelled: '#9ca3af', skipped: '#d1d5db' };

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
const enc = encodeURIComponent;
const can = (role) => (ROLES[S.me && S.me.role] || 0) >= ROLES[role];
const st = (s) => `<span class="st ${esc(s)}">${esc(String(s ?? '-').replace('_', ' '))}</span>`;

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const headers = {};
  if (S.token) headers.Authorization = 'Bearer ' + S.token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let r;
  try {
    r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, 'unreachable', 'cannot reach the server');
  }
  const text = await r.text();
  let v = null;
  try { v = text ? JSON.parse(text) : null; } catch (e) { v = null; }
  if (!r.ok) {
    const e = (v && v.error) || { code: 'http_' + r.status, message: text || r.statusText };
    if (r.status === 401) signIn(e.message);
    throw new ApiError(r.status, e.code, e.message);
  }
  return v;
}

// ---- time and numbers ----
const ms = (t) => (t ? Date.parse(t) : NaN);
function ago(t) {
  const d = (Date.now() - ms(t)) / 1000;
  if (!isFinite(d)) return '-';
  const a = Math.abs(d), s = d >= 0 ? ' ago' : '';
  const pre = d < 0 ? 'in ' : '';
  if (a < 60) return pre + Math.round(a) + 's' + s;
  if (a < 3600) return pre + Math.round(a / 60) + 'm' + s;
  if (a < 86400) return pre + (a / 3600).toFixed(1) + 'h' + s;
  return pre + (a / 86400).toFixed(1) + 'd' + s;
}
const when = (t) => (t ? `<span title="${esc(t)}">${esc(ago(t))}</span>` : '-');
function dur(msec) {
  if (!isFinite(msec)) return '-';
  if (msec < 1000) return Math.round(msec) + ' ms';
  if (msec < 60000) return (msec / 1000).toFixed(1) + ' s';
  return (msec / 60000).toFixed(1) + ' min';
}
function scheduleText(s) {
  if (!s) return 'manual';
  const extra = (s.start_at ? ` from ${s.start_at}` : '') + (s.end_at ? ` until ${s.end_at}` : '') + (s.jitter ? `, jitter ${s.jitter}` : '');
  if (s.cron) return `cron ${s.cron}` + (s.timezone ? ` (${s.timezone})` : '') + extra;
  if (s.every) return `every ${s.every}` + extra;
  if (s.at) return `once at ${s.at}` + extra;
  return 'manual';
}
const executorKind = (e) => Object.keys(e || {})[0] || '-';

// ---- shell: banner, toast, sign-in, confirm ----
function banner(text, bad) {
  const b = $('#banner');
  b.hidden = !text;
  b.textContent = text || '';
  b.className = 'banner' + (bad ? ' bad' : '');
}
function toast(text) {
  let box = $('#toasts');
  if (!box) {
    box = document.createElement('div');
    box.id = 'toasts';
    document.body.appendChild(box);
  }
  const t = document.createElement('div');
  t.className = 'toast';
  t.setAttribute('role', 'status');
  t.textContent = text;
  box.appendChild(t);
  setTimeout(() => t.remove(), 3500);
}
function signIn(why) {
  const d = $('#signin');
  if (d.open) return;
  $('#signin-why').textContent = why || 'This server needs a credential.';
  d.showModal();
}
$('#signin-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  S.token = $('#signin-token').value.trim();
  try {
    S.me = await api('GET', '/v1/whoami');
    sessionStorage.setItem('gnomon.token', S.token);
    $('#signin-err').textContent = '';
    $('#signin').close();
    showWho();
    route();
  } catch (e) {
    $('#signin-err').textContent = e.message;
  }
});
function confirmDo(text) {
  return new Promise((resolve) => {
    const d = $('#confirm');
    $('#confirm-text').textContent = text;
    d.returnValue = '';
    d.onclose = () => resolve(d.returnValue === 'yes');
    d.showModal();
  });
}
function showWho() {
  const w = $('#who');
  if (!S.me) { w.textContent = ''; return; }
  const ns = S.me.namespaces ? ' · ' + S.me.namespaces.join(', ') : '';
  w.innerHTML = `${esc(S.me.name)} <span class="st">${esc(S.me.role)}</span>${esc(ns)}` +
    (S.token ? ' <button id="signout" class="small">Sign out</button>' : '');
  const so = $('#signout');
  if (so) so.onclick = () => { sessionStorage.removeItem('gnomon.token'); S.token = ''; S.me = null; location.hash = '#/'; location.reload(); };
}

// ---- live updates: poll the current view, back off when the server is away ----
function schedule(fn) {
  clearTimeout(S.timer);
  S.timer = setTimeout(async () => {
    const a = document.activeElement;
    const typing = a && a.closest && a.closest('#view') && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName);
    if (S.editing || document.hidden || typing || document.querySelector('dialog[open]')) return schedule(fn);
    try {
      await fn();
      S.delay = 3000;
    } catch (e) {
      S.delay = Math.min(S.delay * 2, 30000);
    }
    schedule(fn);
  }, S.delay);
}
async function leaderBanner() {
  try {
    const l = await api('GET', '/v1/leader');
    S.leader = l;
    if (!l.holder) banner('No leader is elected right now: nothing fires until one is.', true);
    else if (!l.is_self) banner(`This server (${l.answered_by}) is not the leader; ${l.holder} at ${l.address} is (triggers and the worker list are forwarded to it).`, false);
    else if (l.backpressure && l.backpressure.state === 'red') banner(`Backpressure is red in a namespace: its new fires wait until its backlog falls (see Namespaces on the overview).`, true);
    else banner('');
  } catch (e) {
    if (e.status === 0) banner('The server is unreachable. Retrying…', true);
    else if (e.status !== 401) banner(`The server answers ${e.status}: ${e.message}`, true);
    throw e;
  }
}

// ---- charts (inline SVG) ----
function stackedBars(buckets, keys, colors, height = 120) {
  const w = 1000, pad = 26, n = buckets.length || 1, bw = (w - pad) / n;
  const max = Math.max(1, ...buckets.map((b) => keys.reduce((s, k) => s + (b[k] || 0), 0)));
  let bars = '';
  buckets.forEach((b, i) => {
    let y = height - 14;
    for (const k of keys) {
      const h = ((b[k] || 0) / max) * (height - 24);
      if (h > 0) {
        y -= h;
        bars += `<rect x="${pad + i * bw + 0.5}" y="${y.toFixed(1)}" width="${Math.max(bw - 1, 1).toFixed(1)}" height="${h.toFixed(1)}" fill="${colors[k]}"><title>${esc(b.label)}: ${b[k]} ${k}</title></rect>`;
      }
    }
  });
  const axis = `<text x="0" y="10">${max}</text><text x="0" y="${height - 16}">0</text>` +
    (buckets.length ? `<text x="${pad}" y="${height - 2}">${esc(buckets[0].label)}</text><text x="${w - 34}" y="${height - 2}">${esc(buckets[buckets.length - 1].label)}</text>` : '');
  const legend = keys.map((k) => `<span><i style="background:${colors[k]}"></i>${esc(k)}</span>`).join('');
  return `<svg class="chart" viewBox="0 0 ${w} ${height}" role="img">${axis}${bars}</svg><div class="legend">${legend}</div>`;
}
function lineChart(points, label, height = 110) {
  // points: [{x: ms, y: number, ok: bool}]
  const w = 1000, pad = 44;
  if (!points.length) return '<p class="mute">No finished runs yet.</p>';
  const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = Math.max(...ys, 1);
  const px = (x) => pad + ((x - x0) / (x1 - x0)) * (w - pad - 8);
  const py = (y) => height - 14 - (y / y1) * (height - 24);
  const path = points.map((p, i) => (i ? 'L' : 'M') + px(p.x).toFixed(1) + ' ' + py(p.y).toFixed(1)).join(' ');
  const dots = points.map((p) => `<circle cx="${px(p.x).toFixed(1)}" cy="${py(p.y).toFixed(1)}" r="2.5" fill="${p.ok ? COLORS.succeeded : COLORS.failed}"><title>${esc(dur(p.y))}</title></circle>`).join('');
  return `<svg class="chart" viewBox="0 0 ${w} ${height}" role="img"><text x="0" y="10">${esc(dur(y1))}</text><text x="0" y="${height - 16}">0</text>` +
    `<path d="${path}" fill="none" stroke="#2b6cb0" stroke-width="1.5"/>${dots}</svg><div class="legend"><span>${esc(label)}</span><span><i style="background:${COLORS.succeeded}"></i>succeeded</span><span><i style="background:${COLORS.failed}"></i>not succeeded</span></div>`;
}

// ---- data helpers ----
async function recentRuns(max = 3000, query = '') {
  // Newest first, following cursors until `max` runs or the end. A
  // credential limited to several namespaces lists each of them.
  const spaces = S.me && S.me.namespaces && S.me.namespaces.length > 1 ? S.me.namespaces : [null];
  let out = [], truncated = false;
  for (const ns of spaces) {
    let cursor = null, got = 0;
    do {
      const page = await api('GET', `/v1/runs?limit=${Math.min(1000, max)}${query}${ns ? '&namespace=' + enc(ns) : ''}${cursor ? '&cursor=' + enc(cursor) : ''}`);
      out = out.concat(page.runs);
      got += page.runs.length;
      cursor = page.next_cursor;
    } while (cursor && got < max);
    truncated = truncated || !!cursor;
  }
  if (spaces.length > 1) out.sort((a, b) => ms(b.fired_at) - ms(a.fired_at));
  return { runs: out.slice(0, max), truncated };
}
function perMinute(runs) {
  const now = Date.now(), start = now - 3600e3, buckets = [];
  for (let i = 0; i < 60; i++) {
    const t = new Date(start + i * 60e3);
    buckets.push({ label: t.toTimeString().slice(0, 5), succeeded: 0, failed: 0, cancelled: 0, skipped: 0 });
  }
  for (const r of runs) {
    if (!TERMINAL.has(r.state)) continue;
    const i = Math.floor((ms(r.updated_at) - start) / 60e3);
    if (i >= 0 && i < 60) buckets[i][r.state]++;
  }
  return buckets;
}
function outcomeBuckets(runs) {
  // The runs' outcomes in 20 equal stretches of the time they span.
  const done = runs.filter((r) => TERMINAL.has(r.state));
  if (!done.length) return [];
  const t0 = Math.min(...done.map((r) => ms(r.scheduled_at))), t1 = Math.max(...done.map((r) => ms(r.scheduled_at))) + 1;
  const n = 20, step = (t1 - t0) / n, buckets = [];
  for (let i = 0; i < n; i++) {
    const t = new Date(t0 + i * step);
    buckets.push({ label: step < 86400e3 / n ? t.toTimeString().slice(0, 5) : t.toISOString().slice(5, 10), succeeded: 0, failed: 0, cancelled: 0, skipped: 0 });
  }
  for (const r of done) buckets[Math.min(n - 1, Math.floor((ms(r.scheduled_at) - t0) / step))][r.state]++;
  return buckets;
}
function runRows(runs, withJob = true) {
  if (!runs.length) return '<p class="mute">No runs.</p>';
  return `<div class="tbl"><table><thead><tr><th>run</th>${withJob ? '<th>job</th>' : ''}<th>scheduled</th><th>state</th><th>attempt</th><th>fire → end</th><th>reason</th></tr></thead><tbody>` +
    runs.map((r) => `<tr><td class="mono"><a href="#/run/${enc(r.id)}">${esc(r.id)}</a>${r.manual ? ' <span class="mute small">manual</span>' : ''}</td>` +
      (withJob ? `<td><a href="#/job/${enc(r.namespace)}/${enc(r.job)}">${esc(r.job)}</a></td>` : '') +
      `<td>${when(r.scheduled_at)}</td><td>${st(r.state)}</td><td>${r.attempt}</td>` +
      `<td>${TERMINAL.has(r.state) ? esc(dur(ms(r.updated_at) - ms(r.fired_at))) : '-'}</td><td class="wrap">${esc(r.reason || '')}</td></tr>`).join('') +
    '</tbody></table></div>';
}

// Each namespace's use of its quotas and its own backpressure.
function namespaceRows(list) {
  if (!list.length) return '<p class="mute">No namespace holds open runs.</p>';
  const of = (n, max) => `${n.toLocaleString()} <span class="mute">of ${max.toLocaleString()}</span>`;
  return '<div class="tbl"><table id="namespaces-table"><thead><tr><th>namespace</th><th>pressure</th><th>pending</th><th class="hide-sm">waiting</th>' +
    '<th class="hide-sm">running</th><th>open runs</th><th class="hide-sm">backfills</th></tr></thead><tbody>' +
    list.map((u) => `<tr data-namespace="${esc(u.namespace)}"><td>${esc(u.namespace)}</td><td>${st(u.pressure)}</td><td>${u.runs.pending.toLocaleString()}</td>` +
      `<td class="hide-sm">${u.runs.waiting.toLocaleString()}</td><td class="hide-sm">${u.runs.active.toLocaleString()}</td>` +
      `<td>${of(u.open_runs, u.quota.open_runs)}</td><td class="hide-sm">${of(u.backfills, u.quota.backfills)}</td></tr>`).join('') +
    '</tbody></table></div>';
}

// ---- views ----
const views = {};

views.overview = async (el) => {
  const [leader, workers, recent, failures, usage] = await Promise.all([
    api('GET', '/v1/leader'), api('GET', '/v1/workers'), recentRuns(3000), recentRuns(10, '&state=failed'), api('GET', '/v1/namespaces'),
  ]);
  const live = workers.workers.filter((w) => w.state === 'live');
  const cap = live.reduce((s, w) => s + w.capacity, 0), busy = live.reduce((s, w) => s + Math.min(w.running, w.capacity), 0);
  const bp = leader.backpressure;
  const servers = leader.raft
    ? leader.raft.members.map((m) => `<div>${esc(m.id)} · <span class="mono">${esc(m.address)}</span> · ${esc(m.role)}${leader.raft.leader === m.id ? ' · <b>leader</b>' : ''}</div>`).join('')
    : `<div>leader: ${esc(leader.holder || 'none')}${leader.address ? ' at <span class="mono">' + esc(leader.address) + '</span>' : ''}</div><div>this server: ${esc(leader.answered_by)}</div>`;
  el.innerHTML = `<h1>Overview</h1><div class="cards">
    <div class="card" id="card-leader"><h3>Leader</h3><div class="big">${esc(leader.holder || 'none')}</div>
      <div class="mute">${esc(leader.backend)} · token ${esc(leader.token ?? '-')}</div><div class="mute">since ${when(leader.since)}</div>
      <div class="mute">clock ${st(leader.clock.verdict || 'ok')}${leader.clock.skew_ms != null ? ' ' + esc(leader.clock.skew_ms) + ' ms' : ''}</div></div>
    <div class="card"><h3>Backpressure</h3><div class="big">${bp ? st(bp.state) : '-'}</div><div class="mute">${bp ? `${bp.pending} of ${bp.max_pending} pending` : 'known on the leader'}</div></div>
    <div class="card"><h3>Workers</h3><div class="big">${live.length}</div><div class="mute">${cap - busy} free of ${cap} slots</div></div>
    <div class="card"><h3>Servers</h3>${servers}</div>
  </div>
  <h2>Namespaces</h2>${namespaceRows(usage.namespaces)}
  <h2>Runs per minute, last hour</h2>${stackedBars(perMinute(recent.runs), OUTCOMES, COLORS)}
  ${recent.truncated ? '<p class="mute small">From the newest 3,000 runs.</p>' : ''}
  <h2>Latest failures</h2>${runRows(failures.runs.slice(0, 10))}`;
};

let jobFilter = { q: '', ns: '', paused: '', exec: '', outcome: '' };
// The variables a webhook's secrets are read from, as the servers look them up.
function hookSecrets(job) {
  const w = job.triggers.webhook, ns = job.namespace || 'default';
  const names = [w.secret, w.secondary_secret].filter(Boolean);
  const vars = names.map(n => `GNOMON_HOOK_SECRET_${ns}__${n.toUpperCase()}`);
  if (w.secret_env) vars.push(w.secret_env);
  return vars.join(' or ');
}

views.jobs = async (el) => {
  const [jobs, recent] = await Promise.all([api('GET', '/v1/jobs'), recentRuns(2000)]);
  const last = {};
  for (const r of recent.runs) {
    const k = r.namespace + '/' + r.job;
    (last[k] = last[k] || []).length < 8 && TERMINAL.has(r.state) && last[k].push(r.state);
  }
  const namespaces = [...new Set(jobs.jobs.map((j) => j.namespace || 'default'))].sort();
  const f = jobFilter;
  const shown = jobs.jobs.filter((j) => {
    const k = (j.namespace || 'default') + '/' + j.name, outcomes = last[k] || [];
    return (!f.q || (j.name + ' ' + (j.description || '')).toLowerCase().includes(f.q.toLowerCase())) &&
      (!f.ns || (j.namespace || 'default') === f.ns) && (!f.paused || String(j.status.paused) === f.paused) &&
      (!f.exec || executorKind(j.executor) === f.exec) && (!f.outcome || outcomes[0] === f.outcome);
  });
  const opt = (v, cur, label) => `<option value="${esc(v)}"${v === cur ? ' selected' : ''}>${esc(label || v)}</option>`;
  el.innerHTML = `<div class="row spread"><h1>Jobs</h1>${can('admin') ? '<a class="btn primary" id="new-job" href="#/jobs/new">New job</a>' : ''}</div>
  <div class="filters">
    <input id="f-q" placeholder="Search name or description" value="${esc(f.q)}">
    <select id="f-ns">${opt('', f.ns, 'all namespaces')}${namespaces.map((n) => opt(n, f.ns)).join('')}</select>
    <select id="f-paused">${opt('', f.paused, 'paused or not')}${opt('false', f.paused, 'active')}${opt('true', f.paused, 'paused')}</select>
    <select id="f-exec">${opt('', f.exec, 'any executor')}${['shell', 'http', 'handler'].map((x) => opt(x, f.exec)).join('')}</select>
    <select id="f-outcome">${opt('', f.outcome, 'any last outcome')}${OUTCOMES.map((x) => opt(x, f.outcome)).join('')}</select>
  </div>
  <div class="tbl"><table id="jobs-table"><thead><tr><th>name</th><th class="hide-sm">namespace</th><th>schedule</th><th class="hide-sm">executor</th><th>next fire</th><th>last outcomes</th><th></th></tr></thead><tbody>
  ${shown.map((j) => {
    const ns = j.namespace || 'default', k = ns + '/' + j.name;
    const dots = (last[k] || []).map((s) => `<span class="dot ${esc(s)}" title="${esc(s)}"></span>`).join('');
    return `<tr data-job="${esc(j.name)}"><td><a href="#/job/${enc(ns)}/${enc(j.name)}">${esc(j.name)}</a>${j.status.paused ? ' ' + st('paused') : ''}</td><td class="hide-sm">${esc(ns)}</td>` +
      `<td class="mono">${esc(scheduleText(j.schedule))}</td><td class="hide-sm">${esc(executorKind(j.executor))}</td><td>${j.status.paused ? '<span class="mute">paused</span>' : when(j.status.next_fire_at)}</td>` +
      `<td>${dots || '<span class="mute">-</span>'}</td><td>${jobActions(j, true)}</td></tr>`;
  }).join('')}</tbody></table></div>
  <p class="mute small">${shown.length} of ${jobs.jobs.length} jobs.</p>`;
  const bind = (id, key) => { const i = $('#' + id); i.oninput = i.onchange = () => { jobFilter[key] = i.value; views.jobs(el).catch(showError); }; };
  bind('f-ns', 'ns'); bind('f-paused', 'paused'); bind('f-exec', 'exec'); bind('f-outcome', 'outcome');
  const q = $('#f-q');
  q.oninput = () => { jobFilter.q = q.value; clearTimeout(q._t); q._t = setTimeout(() => views.jobs(el).then(() => { const n = $('#f-q'); n.focus(); n.setSelectionRange(n.value.length, n.value.length); }).catch(showError), 250); };
  bindJobActions(el, jobs.jobs, () => views.jobs(el));
};

function jobActions(j, compact) {
  let h = '';
  if (can('operator')) {
    // On a job's page, one field per param, holding its default as JSON.
    if (!compact) {
      for (const [name, spec] of Object.entries(j.params || {})) {
        const value = spec.default === undefined ? '' : (typeof spec.default === 'string' ? spec.default : JSON.stringify(spec.default));
        h += `<input class="param mono" data-param="${esc(name)}" placeholder="${esc(name)}" value="${esc(value)}" title="${esc(name + (spec.description ? ': ' + spec.description : '') + (spec.default === undefined ? ' (required)' : ''))}" style="width:120px"> `;
      }
    }
    h += `<input type="number" class="count" min="1" max="10000" value="1" title="how many runs" style="width:64px"> <button data-act="trigger" data-name="${esc(j.name)}" data-ns="${esc(j.namespace || 'default')}">Trigger</button> `;
    h += `<button data-act="${j.status.paused ? 'resume' : 'pause'}" data-name="${esc(j.name)}" data-ns="${esc(j.namespace || 'default')}">${j.status.paused ? 'Resume' : 'Pause'}</button> `;
  }
  if (can('admin')) {
    if (!compact) h += `<a class="btn" href="#/job/${enc(j.namespace || 'default')}/${enc(j.name)}/edit">Edit</a> `;
    h += `<button class="danger" data-act="delete" data-name="${esc(j.name)}" data-ns="${esc(j.namespace || 'default')}">Delete</button>`;
  }
  return `<span class="row">${h}</span>`;
}
function bindJobActions(el, jobs, after) {
  $$('button[data-act]', el).forEach((b) => {
    b.onclick = async () => {
      const name = b.dataset.name, ns = b.dataset.ns, base = `/v1/jobs/${enc(name)}`, q = `?namespace=${enc(ns)}`;
      try {
        if (b.dataset.act === 'trigger') {
          const count = parseInt((b.parentElement.querySelector('.count') || {}).value || '1', 10) || 1;
          const params = {};
          $$('input.param', b.parentElement).forEach((i) => {
            if (i.value === '' || i.value === i.defaultValue) return;
            try { params[i.dataset.param] = JSON.parse(i.value); } catch (_) { params[i.dataset.param] = i.value; }
          });
          const body = Object.keys(params).length ? { params } : undefined;
          const r = await api('POST', `${base}/trigger${q}${count > 1 ? '&count=' + count : ''}`, body);
          toast(r.ids ? `Created ${r.count} runs of ${name}` : `Triggered ${name}: run ${r.id}`);
        } else if (b.dataset.act === 'delete') {
          if (!(await confirmDo(`Delete job ${ns}/${name}? Its runs stay in the history.`))) return;
          await api('DELETE', base + q);
          toast(`Deleted ${name}`);
          if (location.hash.startsWith('#/job/')) { location.hash = '#/jobs'; return; }
        } else {
          await api('POST', `${base}/${b.dataset.act}${q}`);
          toast(`${b.dataset.act === 'pause' ? 'Paused' : 'Resumed'} ${name}`);
        }
        await after();
      } catch (e) { toast(e.message); }
    };
  });
}

views.job = async (el, ns, name, cursor) => {
  const job = await api('GET', `/v1/jobs/${enc(name)}?namespace=${enc(ns)}`);
  const page = await api('GET', `/v1/runs?job=${enc(name)}&namespace=${enc(ns)}&limit=50${cursor ? '&cursor=' + enc(cursor) : ''}`);
  const fills = (await api('GET', `/v1/backfills?job=${enc(name)}&namespace=${enc(ns)}`)).backfills;
  const pipeline = jobPipeline(job, (await api('GET', `/v1/jobs?namespace=${enc(ns)}`)).jobs);
  const done = page.runs.filter((r) => TERMINAL.has(r.state) && r.state !== 'skipped');
  const ok = done.filter((r) => r.state === 'succeeded').length;
  const points = done.slice().reverse().map((r) => ({ x: ms(r.fired_at), y: ms(r.updated_at) - ms(r.fired_at), ok: r.state === 'succeeded' }));
  const spec = Object.assign({}, job); delete spec.status;
  el.innerHTML = `<div class="row spread"><h1>${esc(ns)}/${esc(name)} ${job.status.paused ? st('paused') : ''}</h1>${jobActions(job, false)}</div>
  ${pipeline}
  <div class="two"><div>
    <div class="cards"><div class="card"><h3>Schedule</h3><div class="mono">${esc(scheduleText(job.schedule))}</div><div class="mute">next ${job.status.paused ? 'paused' : when(job.status.next_fire_at)}</div></div>
    ${job.triggers && job.triggers.webhook ? `<div class="card" id="webhook"><h3>Webhook</h3><div class="mono small">POST ${esc(location.origin)}/v1/hooks/${enc(job.namespace || 'default')}/${enc(job.name)}</div><div class="mute">signed (v2) with the secret ${esc(hookSecrets(job))}</div></div>` : ''}
    <div class="card"><h3>Success rate</h3><div class="big">${done.length ? Math.round((100 * ok) / done.length) + '%' : '-'}</div><div class="mute">${ok} of ${done.length} finished runs on this page</div></div></div>
    <h2>Outcomes over time</h2>${stackedBars(outcomeBuckets(page.runs), OUTCOMES, COLORS, 100)}
    <h2>Duration (fire → end)</h2>${lineChart(points, 'per run, oldest to newest')}
  </div><div><h2>Spec <span class="mute small">version ${job.status.version}</span></h2><pre id="spec">${esc(JSON.stringify(spec, null, 2))}</pre>
    <p class="mute small">created ${when(job.status.created_at)} · updated ${when(job.status.updated_at)} · last fired ${when(job.status.last_scheduled_at)}</p></div></div>
  ${fills.length ? `<h2>Backfills</h2><div class="tbl" id="backfills"><table><thead><tr><th>range</th><th>state</th><th>progress</th><th>created</th><th>kept</th><th>rate</th><th></th></tr></thead><tbody>
  ${fills.map((b) => `<tr><td class="mono small">${esc(b.from)} … ${esc(b.to)}</td><td>${st(b.state)}</td>
    <td><progress max="${b.total}" value="${b.created + b.kept}" title="${b.created + b.kept} of ${b.total}"></progress> <span class="small">${b.created + b.kept}/${b.total}</span></td>
    <td>${b.created}</td><td>${b.kept}</td><td>${b.rate}/s</td>
    <td>${b.state === 'running' && can('operator') ? `<button class="danger" data-backfill="${esc(b.id)}">Cancel</button>` : esc(b.reason || '')}</td></tr>`).join('')}
  </tbody></table></div>` : ''}
  <h2>Runs</h2>${runRows(page.runs, false)}
  <div class="row">${cursor ? `<a class="btn" href="#/job/${enc(ns)}/${enc(name)}">Newest</a>` : ''}${page.next_cursor ? `<a class="btn" id="older" href="#/job/${enc(ns)}/${enc(name)}/runs/${enc(page.next_cursor)}">Older →</a>` : ''}</div>`;
  bindJobActions(el, [job], () => views.job(el, ns, name, cursor));
  el.querySelectorAll('button[data-backfill]').forEach((b) => (b.onclick = async () => {
    if (!(await confirmDo(`Cancel backfill ${b.dataset.backfill}? The runs it created stay.`))) return;
    try { await api('POST', `/v1/backfills/${enc(b.dataset.backfill)}/cancel`); toast('Backfill cancelled'); await views.job(el, ns, name, cursor); } catch (e) { toast(e.message); }
  }));
};

views.runs = async (el, cursor, state) => {
  const page = await api('GET', `/v1/runs?limit=100${cursor ? '&cursor=' + enc(cursor) : ''}${state ? '&state=' + enc(state) : ''}`);
  const opt = (v, label) => `<option value="${esc(v)}"${v === (state || '') ? ' selected' : ''}>${esc(label || v)}</option>`;
  el.innerHTML = `<h1>Runs</h1><div class="filters"><select id="f-state">${opt('', 'any state')}${['waiting', 'pending', 'assigned', 'running', 'retrying', ...OUTCOMES].map((s) => opt(s)).join('')}</select></div>
  ${runRows(page.runs)}<div class="row">${cursor ? `<a class="btn" href="#/runs${state ? '/state/' + enc(state) : ''}">Newest</a>` : ''}${page.next_cursor ? `<a class="btn" href="#/runs/page/${enc(page.next_cursor)}${state ? '/' + enc(state) : ''}">Older →</a>` : ''}</div>`;
  $('#f-state').onchange = (e) => { location.hash = e.target.value ? '#/runs/state/' + enc(e.target.value) : '#/runs'; };
};

// A running attempt's output, as its worker streams it: read on from the
// last answer's `next` every second while the page shows it. Kept as text
// (never HTML), the newest 256 KiB.
function tailLive(run, attempt) {
  if (!S.live || S.live.run !== run || S.live.attempt !== attempt) S.live = { run, attempt, next: 0, text: '' };
  const show = () => {
    const pre = $('#live-output');
    if (pre) { pre.textContent = S.live.text || '(nothing yet)'; pre.scrollTop = pre.scrollHeight; }
    return pre;
  };
  show();
  clearInterval(S.liveTimer);
  const pull = async () => {
    if (!show()) { clearInterval(S.liveTimer); return; }
    try {
      const o = await api('GET', `/v1/runs/${enc(run)}/output?attempt=${attempt}&from=${S.live.next}`);
      if (!o.live) { clearInterval(S.liveTimer); return; }
      if (o.skipped) S.live.text += `\n[${o.skipped} earlier bytes are no longer kept]\n`;
      S.live.text = (S.live.text + o.text).slice(-262144);
      S.live.next = o.next;
      show();
    } catch (e) { /* the page's own refresh shows what is wrong */ }
  };
  pull();
  S.liveTimer = setInterval(pull, 1000);
}

views.run = async (el, id) => {
  const r = await api('GET', `/v1/runs/${enc(id)}`);
  const graph = await runPipeline(r);
  const attempts = r.attempts || [];
  const current = attempts[attempts.length - 1];
  const live = current && !TERMINAL.has(r.state) && ['assigned', 'running'].includes(current.state) ? current : null;
  const t0 = Math.min(ms(r.fired_at), ...attempts.map((a) => ms(a.assigned_at)));
  const t1 = Math.max(Date.now() > t0 && !TERMINAL.has(r.state) ? Date.now() : ms(r.updated_at), ...attempts.map((a) => ms(a.ended_at) || 0), t0 + 1);
  const pct = (t) => (((t - t0) / (t1 - t0)) * 100).toFixed(2);
  const bars = attempts.map((a) => {
    const started = ms(a.started_at), ended = ms(a.ended_at) || (TERMINAL.has(r.state) ? ms(r.updated_at) : Date.now());
    const wait = `<span class="wait" style="left:${pct(ms(a.assigned_at))}%;width:${Math.max(0, pct(isFinite(started) ? started : ended) - pct(ms(a.assigned_at))).toFixed(2)}%" title="assigned, waiting to start"></span>`;
    const exec = isFinite(started) ? `<span class="exec ${esc(a.state)}" style="left:${pct(started)}%;width:${Math.max(0.3, pct(ended) - pct(started)).toFixed(2)}%" title="${esc(a.state)}"></span>` : '';
    return `<div class="row"><span class="mono small" style="width:80px">attempt ${a.attempt}</span><div class="tl" style="flex:1">${wait}${exec}</div></div>`;
  }).join('');
  el.innerHTML = `<div class="row spread"><h1 class="mono">${esc(r.id)}</h1>${can('operator') && !TERMINAL.has(r.state) ? '<button class="danger" id="cancel">Cancel run</button>' : ''}</div>
  <div class="cards"><div class="card"><h3>State</h3><div class="big">${st(r.state)}</div><div class="mute">${esc(r.reason || '')}${r.cancel_requested && !TERMINAL.has(r.state) ? ' cancelling…' : ''}</div></div>
  <div class="card"><h3>Job</h3><a href="#/job/${enc(r.namespace)}/${enc(r.job)}">${esc(r.namespace)}/${esc(r.job)}</a><div class="mute">${r.manual ? (r.reason === 'webhook' ? 'webhook call' : 'manual trigger') : r.graph && r.graph.upstream.length ? 'after its upstreams' : 'scheduled'}</div></div>
  <div class="card"><h3>Scheduled</h3><div title="${esc(r.scheduled_at)}">${esc(r.scheduled_at)}</div><div class="mute">fired ${when(r.fired_at)}</div></div>
  <div class="card"><h3>Attempts</h3><div class="big">${attempts.length}</div><div class="mute">${r.next_attempt_at ? 'next ' + when(r.next_attempt_at) : ''}${esc(r.waiting_for || '')}</div></div></div>
  ${r.params ? `<h2>Params</h2><div class="tbl"><table><thead><tr><th>name</th><th>value</th></tr></thead><tbody>
  ${Object.entries(r.params).map(([k, v]) => `<tr><td class="mono">${esc(k)}</td><td class="mono">${esc(typeof v === 'string' ? v : JSON.stringify(v))}</td></tr>`).join('')}
  </tbody></table></div>` : ''}
  ${graph}
  ${r.payload !== undefined ? `<h2>Payload</h2><pre class="output" id="payload">${esc(r.payload)}</pre>` : ''}
  <h2>Timeline</h2><div class="timeline">${bars || '<p class="mute">No attempt yet.</p>'}</div>
  <div class="legend"><span><i style="background:#cbd5e1"></i>assigned, not started</span><span><i style="background:#2b6cb0"></i>running</span><span><i style="background:${COLORS.succeeded}"></i>succeeded</span><span><i style="background:${COLORS.failed}"></i>failed, timed out or lost</span></div>
  <h2>Attempts</h2><div class="tbl"><table><thead><tr><th>#</th><th>worker</th><th>token</th><th>state</th><th>assigned</th><th>started</th><th>ended</th><th>exit</th></tr></thead><tbody>
  ${attempts.map((a) => `<tr><td>${a.attempt}</td><td class="mono">${esc(a.worker)}</td><td>${a.token}</td><td>${st(a.state)}</td><td>${esc(a.assigned_at)}</td><td>${esc(a.started_at || '-')}</td><td>${esc(a.ended_at || '-')}</td><td>${esc(a.exit_code ?? '-')}</td></tr>`).join('')}
  </tbody></table></div>
  ${(r.notifications || []).length ? `<h2>Notifications</h2><div class="tbl"><table><thead><tr><th>outcome</th><th>kind</th><th>to</th><th>state</th><th>tries</th><th>detail</th></tr></thead><tbody>
  ${r.notifications.map((n) => `<tr><td>${esc(n.outcome)}</td><td>${esc(n.kind)}</td><td class="mono">${esc(n.destination)}</td><td>${st(n.state)}</td><td>${n.attempts}</td><td>${esc([n.last_error, n.next_at ? 'next ' + when(n.next_at) : ''].filter(Boolean).join('; ') || '-')}</td></tr>`).join('')}
  </tbody></table></div>` : ''}
  ${attempts.map((a) => live && a.attempt === live.attempt
    ? `<h2>Output of attempt ${a.attempt} <span class="st running">live</span></h2><pre class="output" id="live-output"></pre>`
    : `<h2>Output of attempt ${a.attempt}</h2><pre class="output">${esc(a.output || '(none)')}</pre>`).join('')}`;
  if (live) tailLive(r.id, live.attempt);
  const c = $('#cancel');
  if (c) c.onclick = async () => {
    if (!(await confirmDo(`Cancel run ${r.id}? A running attempt is stopped.`))) return;
    try { await api('POST', `/v1/runs/${enc(id)}/cancel`); toast('Cancel requested'); await views.run(el, id); } catch (e) { toast(e.message); }
  };
};

views.workers = async (el) => {
  const w = await api('GET', '/v1/workers');
  el.innerHTML = `<h1>Workers</h1>${w.workers.length ? '' : '<p class="mute">No worker is connected to the leader.</p>'}
  <div class="tbl"><table><thead><tr><th>worker</th><th>state</th><th>session</th><th>labels</th><th>namespaces</th><th>running</th><th>queued</th><th>capacity</th><th>prefetch</th><th>load</th><th>executors</th><th>handlers</th><th>lease expires</th></tr></thead><tbody>
  ${w.workers.map((x) => `<tr><td class="mono">${esc(x.id)}</td><td>${st(x.state)}</td><td class="mono small">${esc(x.session)}</td>` +
    `<td>${Object.entries(x.labels).map(([k, v]) => `<code>${esc(k)}=${esc(v)}</code>`).join(' ') || '-'}</td><td>${x.namespaces ? esc(x.namespaces.join(', ')) : 'all'}</td><td>${Math.min(x.running, x.capacity)}</td><td>${Math.max(0, x.running - x.capacity)}</td><td>${x.capacity}</td><td>${x.prefetch}</td>` +
    `<td>${Math.round(x.load * 100)}%</td><td>${esc(x.executors.join(', '))}</td><td>${esc(x.handlers.join(', ') || '-')}</td><td>${when(x.lease_expires_at)}</td></tr>`).join('')}
  </tbody></table></div>`;
};

// ---- the job form (console-form.js) ----
views.edit = (el, ns, name) => editView(el, ns, name);

// ---- routing ----
function showError(e) {
  if (e.status === 401) return;
  $('#view').innerHTML = `<h1>${e.status === 404 ? 'Not found' : 'Cannot show this page'}</h1><p class="err">${esc(e.message)}</p><p><a href="#/">Overview</a></p>`;
}
async function route() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const el = $('#view');
  S.editing = false;
  let nav = 'overview', run = () => views.overview(el), live = true;
  const [a, b, c, d, e] = parts;
  if (a === 'jobs' && b === 'new') { nav = 'jobs'; run = () => views.edit(el); live = false; }
  else if (a === 'jobs') { nav = 'jobs'; run = () => views.jobs(el); }
  else if (a === 'job' && d === 'edit') { nav = 'jobs'; run = () => views.edit(el, b, c); live = false; }
  else if (a === 'job' && d === 'runs') { nav = 'jobs'; run = () => views.job(el, b, c, e); }
  else if (a === 'job') { nav = 'jobs'; run = () => views.job(el, b, c); }
  else if (a === 'runs' && b === 'page') { nav = 'runs'; run = () => views.runs(el, c, d); }
  else if (a === 'runs' && b === 'state') { nav = 'runs'; run = () => views.runs(el, null, c); }
  else if (a === 'runs') { nav = 'runs'; run = () => views.runs(el); }
  else if (a === 'run') { nav = 'runs'; run = () => views.run(el, b); }
  else if (a === 'workers') { nav = 'workers'; run = () => views.workers(el); }
  $$('#nav a').forEach((x) => x.classList.toggle('on', x.dataset.nav === nav));
  clearTimeout(S.timer);
  S.delay = 3000;
  try {
    await leaderBanner();
    await run();
  } catch (err) {
    showError(err);
  }
  if (live) schedule(async () => { await leaderBanner(); await run(); });
  else schedule(leaderBanner);
}

window.addEventListener('hashchange', route);
(async () => {
  try {
    S.me = await api('GET', '/v1/whoami');
    showWho();
  } catch (e) {
    if (e.status !== 401) banner(e.status === 0 ? 'The server is unreachable. Retrying…' : e.message, true);
  }
  route();
})();
