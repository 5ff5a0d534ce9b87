// The console's job form (create and edit): loaded before console.js, whose
// helpers (esc, api, …) it calls when a form is shown.
// ---- the job form ----
const FORM_FIELDS = ['name', 'namespace', 'description', 'schedule.cron', 'schedule.timezone', 'schedule.every', 'schedule.at',
  'schedule.start_at', 'schedule.end_at', 'schedule.jitter', 'timeout',
  'retry.max_attempts', 'retry.backoff.initial', 'retry.backoff.max', 'overlap', 'misfire', 'catchup_window', 'route.strategy', 'route.labels', 'notify', 'executor'];

function field(path, label, input, hint) {
  return `<label data-field="${esc(path)}">${esc(label)}${input}<span class="err" data-err="${esc(path)}"></span>${hint ? `<span class="small mute">${esc(hint)}</span>` : ''}</label>`;
}
const text = (id, v, ph) => `<input id="${id}" value="${esc(v ?? '')}" placeholder="${esc(ph || '')}">`;
const select = (id, v, opts) => `<select id="${id}">${opts.map(([k, l]) => `<option value="${esc(k)}"${k === (v ?? '') ? ' selected' : ''}>${esc(l)}</option>`).join('')}</select>`;
const kv = (o) => Object.entries(o || {}).map(([k, v]) => `${k}=${v}`).join('\n');
function parseKv(s) {
  const o = {};
  for (const line of s.split('\n').map((l) => l.trim()).filter(Boolean)) {
    const i = line.indexOf('=');
    if (i < 1) throw new ApiError(400, 'invalid_form', `"${line}" is not KEY=VALUE`);
    o[line.slice(0, i)] = line.slice(i + 1);
  }
  return o;
}

async function editView(el, ns, name) {
  let job = { schedule: { cron: '0 */5 * * * *', timezone: 'UTC' }, executor: { shell: { command: '', args: [] } } };
  let version = null;
  if (name) {
    job = await api('GET', `/v1/jobs/${enc(name)}?namespace=${enc(ns)}`);
    version = job.status.version;
    delete job.status;
  }
  S.editing = true;
  const s = job.schedule || {}, kind = s.cron ? 'cron' : s.every ? 'every' : s.at ? 'at' : 'manual';
  const ex = executorKind(job.executor), e = (job.executor || {})[ex] || {};
  const r = job.retry || {}, b = r.backoff || {}, route = job.route || {};
  el.innerHTML = `<h1>${name ? 'Edit ' + esc(ns) + '/' + esc(name) : 'New job'}</h1>
  <div class="tabs"><button class="on" id="tab-form" type="button">Form</button><button id="tab-json" type="button">JSON</button></div>
  <p class="err" id="form-err"></p>
  <form id="job-form" novalidate><div class="two"><div>
    <div class="grid">${field('name', 'Name', name ? `<input id="f-name" value="${esc(job.name)}" disabled>` : text('f-name', job.name, 'nightly-report'))}
    ${field('namespace', 'Namespace', name ? `<input id="f-namespace" value="${esc(job.namespace || 'default')}" disabled>` : text('f-namespace', job.namespace, 'default'))}</div>
    ${field('description', 'Description', text('f-description', job.description))}
    <fieldset><legend>Schedule</legend><div class="grid">
      ${field('schedule', 'Kind', select('f-kind', kind, [['cron', 'cron expression'], ['every', 'fixed interval'], ['at', 'once, at a time'], ['manual', 'manual only']]))}
      ${field('schedule.cron', 'Cron (seconds first, or 5 fields)', text('f-cron', s.cron, '0 30 2 * * *'))}
      ${field('schedule.timezone', 'Time zone', text('f-timezone', s.timezone, 'UTC'), 'IANA name, e.g. Europe/Berlin')}
      ${field('schedule.every', 'Every', text('f-every', s.every, '5m'))}
      ${field('schedule.at', 'At (RFC 3339)', text('f-at', s.at, '2027-01-01T09:00:00Z'))}
      ${field('schedule.start_at', 'Starts at (RFC 3339, optional)', text('f-start', s.start_at, 'first instant'), 'no instants before it')}
      ${field('schedule.end_at', 'Ends at (RFC 3339, optional)', text('f-end', s.end_at, 'last instant'), 'no instants after it')}
      ${field('schedule.jitter', 'Jitter (optional)', text('f-jitter', s.jitter, '30s'), 'each fire delayed by up to this, the same on every leader')}
    </div></fieldset>
    <fieldset><legend>Executor</legend><div class="grid">${field('executor', 'Kind', select('f-ex', ex, [['shell', 'shell command'], ['http', 'HTTP request'], ['handler', 'registered handler']]))}</div>
      <div class="grid ex ex-shell">${field('executor.shell.command', 'Command', text('f-command', e.command, '/usr/local/bin/report'))}
        ${field('executor.shell.args', 'Arguments (one per line)', `<textarea id="f-args">${esc((e.args || []).join('\n'))}</textarea>`)}
        ${field('executor.shell.env', 'Environment (KEY=VALUE lines)', `<textarea id="f-env">${esc(kv(e.env))}</textarea>`)}</div>
      <div class="grid ex ex-http">${field('executor.http.method', 'Method', select('f-method', e.method || 'GET', ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'].map((m) => [m, m])))}
        ${field('executor.http.url', 'URL', text('f-url', e.url, 'https://example.internal/hook'))}
        ${field('executor.http.headers', 'Headers (KEY=VALUE lines)', `<textarea id="f-headers">${esc(kv(e.headers))}</textarea>`)}
        ${field('executor.http.body', 'Body', `<textarea id="f-body">${esc(e.body || '')}</textarea>`)}
        ${field('executor.http.expect_status', 'Expected status', text('f-expect', e.expect_status, 'any 2xx'))}</div>
      <div class="grid ex ex-handler">${field('executor.handler.name', 'Handler', text('f-handler', e.name, 'noop'))}
        ${field('executor.handler.payload', 'Payload (JSON)', `<textarea id="f-payload">${esc(e.payload === undefined ? '' : JSON.stringify(e.payload, null, 2))}</textarea>`)}</div>
    </fieldset>
    <fieldset><legend>Policies</legend><div class="grid">
      ${field('timeout', 'Timeout', text('f-timeout', job.timeout, '10m'))}
      ${field('retry.max_attempts', 'Max attempts', text('f-attempts', r.max_attempts, '1'))}
      ${field('retry.backoff.initial', 'Backoff initial', text('f-binit', b.initial, '1s'))}
      ${field('retry.backoff.max', 'Backoff max', text('f-bmax', b.max, '1m'))}
      ${field('overlap', 'Overlap', select('f-overlap', job.overlap || 'allow', [['allow', 'allow'], ['forbid', 'forbid (skip)'], ['replace', 'replace'], ['buffer_one', 'buffer one']]))}
      ${field('misfire', 'Misfire', select('f-misfire', job.misfire || 'fire_once', [['fire_once', 'fire once'], ['fire_all', 'fire all'], ['skip', 'skip']]))}
      ${field('catchup_window', 'Catch-up window', text('f-catchup', job.catchup_window, '1h'))}
      ${field('route.strategy', 'Routing', select('f-strategy', route.strategy || 'least_loaded', [['least_loaded', 'least loaded'], ['round_robin', 'round robin'], ['consistent_hash', 'consistent hash']]))}
      ${field('route.labels', 'Worker labels (KEY=VALUE lines)', `<textarea id="f-labels">${esc(kv(route.labels))}</textarea>`)}
      ${field('notify', 'Notify (JSON list of targets)', `<textarea id="f-notify" placeholder='[{"on":["failed"],"webhook":{"url":"https://…"}}]'>${esc(job.notify && job.notify.length ? JSON.stringify(job.notify, null, 1) : '')}</textarea>`, 'on: failed, succeeded, late, recovered; webhook {url, secret, headers} or slack {url}')}
    </div></fieldset>
  </div><div><h2>Next fire times</h2><div class="preview" id="preview"><p class="mute">…</p></div></div></div>
  <div class="row"><button class="primary" id="save" type="submit">${name ? 'Save' : 'Create'}</button><a class="btn" href="${name ? `#/job/${enc(ns)}/${enc(name)}` : '#/jobs'}">Cancel</a></div></form>
  <div id="json-pane" hidden><textarea id="json" style="min-height:420px"></textarea><div class="row"><button class="primary" id="save-json" type="button">${name ? 'Save' : 'Create'}</button></div></div>`;

  const showKinds = () => {
    const k = $('#f-kind').value;
    for (const f of ['cron', 'timezone', 'every', 'at']) $(`[data-field="schedule.${f}"]`).hidden = !(k === f || (k === 'cron' && f === 'timezone'));
    for (const f of ['start_at', 'end_at']) $(`[data-field="schedule.${f}"]`).hidden = !(k === 'cron' || k === 'every');
    $('[data-field="schedule.jitter"]').hidden = k === 'manual';
    $$('.ex').forEach((g) => { g.hidden = !g.classList.contains('ex-' + $('#f-ex').value); });
  };
  const v = (id) => $('#' + id).value.trim();
  const scheduleOf = () => {
    const k = v('f-kind'), out = {};
    if (k === 'cron') { out.cron = v('f-cron'); if (v('f-timezone')) out.timezone = v('f-timezone'); }
    if (k === 'every') out.every = v('f-every');
    if (k === 'at') out.at = v('f-at');
    if ((k === 'cron' || k === 'every') && v('f-start')) out.start_at = v('f-start');
    if ((k === 'cron' || k === 'every') && v('f-end')) out.end_at = v('f-end');
    if (k !== 'manual' && v('f-jitter')) out.jitter = v('f-jitter');
    return out;
  };
  const specOf = () => {
    const spec = { name: v('f-name'), schedule: scheduleOf() };
    if (v('f-namespace')) spec.namespace = v('f-namespace');
    if (v('f-description')) spec.description = v('f-description');
    const k = v('f-ex');
    if (k === 'shell') {
      spec.executor = { shell: { command: v('f-command'), args: $('#f-args').value.split('\n').filter((l) => l.length) } };
      const env = parseKv($('#f-env').value); if (Object.keys(env).length) spec.executor.shell.env = env;
    } else if (k === 'http') {
      spec.executor = { http: { method: v('f-method'), url: v('f-url') } };
      const h = parseKv($('#f-headers').value); if (Object.keys(h).length) spec.executor.http.headers = h;
      if ($('#f-body').value) spec.executor.http.body = $('#f-body').value;
      if (v('f-expect')) spec.executor.http.expect_status = Number(v('f-expect'));
    } else {
      spec.executor = { handler: { name: v('f-handler') } };
      if (v('f-payload')) {
        try { spec.executor.handler.payload = JSON.parse(v('f-payload')); } catch (err) { throw new ApiError(400, 'invalid_json', 'executor.handler.payload: not JSON: ' + err.message); }
      }
    }
    if (v('f-timeout')) spec.timeout = v('f-timeout');
    if (v('f-attempts') || v('f-binit') || v('f-bmax')) {
      spec.retry = {};
      if (v('f-attempts')) spec.retry.max_attempts = Number(v('f-attempts'));
      if (v('f-binit') || v('f-bmax')) { spec.retry.backoff = {}; if (v('f-binit')) spec.retry.backoff.initial = v('f-binit'); if (v('f-bmax')) spec.retry.backoff.max = v('f-bmax'); }
    }
    spec.overlap = v('f-overlap');
    spec.misfire = v('f-misfire');
    if (v('f-catchup')) spec.catchup_window = v('f-catchup');
    const labels = parseKv($('#f-labels').value);
    if (v('f-strategy') !== 'least_loaded' || Object.keys(labels).length) spec.route = { strategy: v('f-strategy'), labels };
    if (v('f-notify')) {
      try { spec.notify = JSON.parse(v('f-notify')); } catch (err) { throw new ApiError(400, 'invalid_json', 'notify: not JSON: ' + err.message); }
    }
    return spec;
  };
  const clearErrors = () => { $$('[data-err]', el).forEach((x) => { x.textContent = ''; }); $$('.invalid', el).forEach((x) => x.classList.remove('invalid')); $('#form-err').textContent = ''; };
  const showFieldError = (err) => {
    // Field errors read "path: message"; show them under the field.
    const m = /^([a-z_.\[\]0-9]+): (.*)$/s.exec(err.message || '');
    let path = m && m[1].replace(/\[\d+\].*$/, '');
    while (path && !$(`[data-err="${path}"]`, el)) path = path.includes('.') ? path.slice(0, path.lastIndexOf('.')) : null;
    if (path && !$('#job-form').hidden) {
      const slot = $(`[data-err="${path}"]`, el);
      slot.textContent = `${m[2]} (${err.code})`;
      const input = slot.parentElement.querySelector('input,select,textarea');
      if (input) { input.classList.add('invalid'); input.focus(); input.scrollIntoView({ block: 'center' }); }
    } else {
      $('#form-err').textContent = `${err.message} (${err.code})`;
    }
  };
  const save = async (spec) => {
    clearErrors();
    try {
      const target = spec.name || v('f-name');
      const saved = name
        ? await api('PUT', `/v1/jobs/${enc(name)}?namespace=${enc(ns)}&version=${version}`, spec)
        : await api('POST', '/v1/jobs', spec);
      S.editing = false;
      toast(name ? `Saved ${target}` : `Created ${target}`);
      location.hash = `#/job/${enc(saved.namespace || 'default')}/${enc(saved.name)}`;
    } catch (err) {
      if (err.status) showFieldError(err); else $('#form-err').textContent = err.message;
    }
  };
  let previewTimer = null;
  const preview = () => {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(async () => {
      const box = $('#preview');
      if (!box) return;
      try {
        const body = { schedule: scheduleOf(), count: 10 };
        if (v('f-name')) { body.job = v('f-name'); if (v('f-namespace')) body.namespace = v('f-namespace'); }
        const p = await api('POST', '/v1/schedules/preview', body);
        const bounds = (p.start_at ? ` from ${esc(p.start_at)}` : '') + (p.end_at ? ` until ${esc(p.end_at)}` : '');
        box.innerHTML = p.fires.length
          ? `<p class="mute small">In ${esc(p.timezone)}${bounds ? ', instants' + bounds + ' only' : ''}:</p><ol>${p.fires.map((f) => `<li class="${f.offset_changed_from || f.note ? 'dst' : ''}"><span class="mono">${esc(f.local)}</span>` +
            `${f.fire_at ? ` <span class="mute small">fires ${esc(f.fire_at)}</span>` : ''}` +
            `${f.offset_changed_from ? ` <b>clocks changed ${esc(f.offset_changed_from)} → ${esc(f.offset)}</b>` : ''}${f.note ? `<div class="small">${esc(f.note)}</div>` : ''}</li>`).join('')}</ol>`
          : '<p class="mute">This schedule does not fire by itself (manual triggers only), or not again.</p>';
      } catch (err) {
        box.innerHTML = `<p class="err">${esc(err.message)}</p>`;
      }
    }, 300);
  };
  showKinds();
  preview();
  $('#f-kind').onchange = () => { showKinds(); preview(); };
  $('#f-ex').onchange = showKinds;
  for (const id of ['f-cron', 'f-timezone', 'f-every', 'f-at', 'f-start', 'f-end', 'f-jitter', 'f-name']) $('#' + id).oninput = preview;
  $('#job-form').onsubmit = (ev) => { ev.preventDefault(); try { save(specOf()); } catch (err) { showFieldError(err); } };
  $('#tab-form').onclick = () => { $('#job-form').hidden = false; $('#json-pane').hidden = true; $('#tab-form').classList.add('on'); $('#tab-json').classList.remove('on'); };
  $('#tab-json').onclick = () => {
    clearErrors();
    try { $('#json').value = JSON.stringify(specOf(), null, 2); } catch (err) { showFieldError(err); return; }
    $('#job-form').hidden = true; $('#json-pane').hidden = false; $('#tab-json').classList.add('on'); $('#tab-form').classList.remove('on');
  };
  $('#save-json').onclick = () => {
    let spec;
    try { spec = JSON.parse($('#json').value); } catch (err) { $('#form-err').textContent = 'Not JSON: ' + err.message; return; }
    save(spec);
  };
}
