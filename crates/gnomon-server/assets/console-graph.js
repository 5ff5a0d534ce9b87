// The console's pipeline drawings: a job's upstreams and downstreams, and
// the runs of one instant, as layered left-to-right SVG (upstreams on the
// left). Loaded before console.js, whose helpers (api, esc, enc,
// scheduleText) these functions call when a view draws.
'use strict';

const DAG = { w: 184, h: 46, gapX: 116, gapY: 20, pad: 12, maxRuns: 40 };
const RUN_STATES = ['waiting', 'pending', 'assigned', 'running', 'retrying', 'succeeded', 'failed', 'cancelled', 'skipped'];
let dagSeq = 0;

const clip = (s, n) => { const t = String(s ?? ''); return t.length > n ? t.slice(0, n - 1) + '…' : t; };

// Places `nodes` ({id, label}) in columns by the longest path of `edges`
// ({from, to}) that reaches them; an edge that spans several columns
// passes through a waypoint in each column between its ends, so it goes
// around the boxes. Each column is ordered to keep edges short (a few
// barycenter sweeps). A cycle (two writes that raced) ends the layering
// after as many rounds as there are nodes. Returns each node's and
// waypoint's top-left corner, each edge's route (the ids it passes) and
// the drawing's size.
function dagLayout(nodes, edges) {
  const layer = new Map(nodes.map((n) => [n.id, 0]));
  for (let round = 0; round < nodes.length; round++) {
    let moved = false;
    for (const e of edges) {
      const l = layer.get(e.from) + 1;
      if (l > layer.get(e.to) && l < nodes.length) { layer.set(e.to, l); moved = true; }
    }
    if (!moved) break;
  }
  const label = new Map(nodes.map((n) => [n.id, String(n.label)]));
  const segs = [];
  const routes = edges.map((e, i) => {
    const a = layer.get(e.from), b = layer.get(e.to), ids = [e.from];
    for (let l = a + 1; l < b; l++) {
      const id = `\u0000${i}:${l}`;
      layer.set(id, l);
      label.set(id, label.get(e.from));
      ids.push(id);
    }
    ids.push(e.to);
    for (let k = 1; k < ids.length; k++) segs.push({ from: ids[k - 1], to: ids[k] });
    return ids;
  });
  let cols = [];
  for (const [id, l] of layer) (cols[l] = cols[l] || []).push(id);
  cols = cols.filter(Boolean);
  cols.forEach((c) => c.sort((a, b) => label.get(a).localeCompare(label.get(b)) || a.localeCompare(b)));
  const rank = new Map();
  const place = (c) => c.forEach((id, i) => rank.set(id, i - (c.length - 1) / 2));
  cols.forEach(place);
  const near = (id, down) => segs.filter((e) => (down ? e.to : e.from) === id).map((e) => rank.get(down ? e.from : e.to));
  for (let sweep = 0; sweep < 8; sweep++) {
    const down = sweep % 2 === 0;
    for (const c of down ? cols.slice(1) : cols.slice(0, -1).reverse()) {
      const at = new Map(c.map((id) => {
        const r = near(id, down);
        return [id, r.length ? r.reduce((t, x) => t + x, 0) / r.length : rank.get(id)];
      }));
      c.sort((a, b) => at.get(a) - at.get(b));
      place(c);
    }
  }
  const rows = Math.max(...cols.map((c) => c.length));
  const pos = new Map();
  cols.forEach((c, l) => c.forEach((id, i) => pos.set(id, {
    x: DAG.pad + l * (DAG.w + DAG.gapX),
    y: DAG.pad + ((rows - c.length) * (DAG.h + DAG.gapY)) / 2 + i * (DAG.h + DAG.gapY),
  })));
  return { pos, routes, width: 2 * DAG.pad + cols.length * DAG.w + (cols.length - 1) * DAG.gapX, height: 2 * DAG.pad + rows * DAG.h + (rows - 1) * DAG.gapY };
}

// The curve from (x0, y0) to (x3, y3), leaving and arriving level: its
// path and its point at t (0 to 1).
function dagCurve(x0, y0, x3, y3) {
  const c = Math.max(36, Math.abs(x3 - x0) / 2), x1 = x0 + c, x2 = x3 - c;
  const bez = (t, p0, p1, p2, p3) => (1 - t) ** 3 * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t * t * p2 + t ** 3 * p3;
  const f = (v) => v.toFixed(1);
  return { d: `C${f(x1)} ${f(y0)} ${f(x2)} ${f(y3)} ${f(x3)} ${f(y3)}`, at: (t) => [bez(t, x0, x1, x2, x3), bez(t, y0, y0, y3, y3)] };
}

// The SVG of a graph. nodes: {id, label, sub, title, href, cls, attrs};
// edges: {from, to, on}. Every text is escaped; nothing runs inline.
function dagSvg(nodes, edges, caption) {
  if (!nodes.length) return '';
  const known = new Set(nodes.map((n) => n.id));
  edges = edges.filter((e) => known.has(e.from) && known.has(e.to) && e.from !== e.to);
  const { pos, routes, width, height } = dagLayout(nodes, edges);
  const arrow = 'dag-arrow-' + (++dagSeq);
  const lines = [], labels = [];
  // Label boxes go where they cover no box and no other label.
  const taken = nodes.map((n) => { const p = pos.get(n.id); return [p.x, p.y, p.x + DAG.w, p.y + DAG.h]; });
  const free = (b) => !taken.some((t) => b[0] < t[2] && t[0] < b[2] && b[1] < t[3] && t[1] < b[3]);
  edges.forEach((e, i) => {
    const ids = routes[i], f = (v) => v.toFixed(1);
    const p = pos.get(ids[0]);
    let x = p.x + DAG.w, y = p.y + DAG.h / 2, d = `M${f(x)} ${f(y)}`, last = null;
    for (const id of ids.slice(1)) {
      const q = pos.get(id), ty = q.y + DAG.h / 2;
      last = dagCurve(x, y, q.x, ty);
      d += last.d;
      x = q.x; y = ty;
      if (id !== e.to) { x = q.x + DAG.w; d += `L${f(x)} ${f(y)}`; }
    }
    const on = String(e.on || 'succeeded'), tw = on.length * 6.4 + 10;
    const data = `data-from="${esc(e.from)}" data-to="${esc(e.to)}" data-on="${esc(on)}"`;
    lines.push(`<path class="edge on-${esc(on)}" ${data} d="${d}" marker-end="url(#${arrow})"/>`);
    let box = null;
    for (const t of [0.5, 0.3, 0.7, 0.2, 0.8, 0.5]) {
      const [lx, ly] = last.at(t);
      box = [lx - tw / 2, ly - 8, lx + tw / 2, ly + 8];
      if (free(box)) break;
    }
    taken.push(box);
    labels.push(`<g class="edge-label on-${esc(on)}" ${data}><rect x="${f(box[0])}" y="${f(box[1])}" width="${f(tw)}" height="16" rx="8"/>` +
      `<text x="${f(box[0] + tw / 2)}" y="${f(box[1] + 12)}" text-anchor="middle">${esc(on)}</text></g>`);
  });
  const boxes = nodes.map((n) => {
    const p = pos.get(n.id);
    const attrs = Object.entries(n.attrs || {}).map(([k, v]) => ` data-${k}="${esc(v)}"`).join('');
    return `<a href="${esc(n.href)}" class="node ${esc(n.cls || '')}" data-node="${esc(n.id)}"${attrs}><title>${esc(n.title || n.label)}</title>` +
      `<rect x="${p.x}" y="${p.y.toFixed(1)}" width="${DAG.w}" height="${DAG.h}" rx="7"/>` +
      `<text class="name" x="${p.x + 11}" y="${(p.y + 19).toFixed(1)}">${esc(clip(n.label, 22))}</text>` +
      `<text class="sub" x="${p.x + 11}" y="${(p.y + 36).toFixed(1)}">${esc(clip(n.sub, 28))}</text></a>`;
  });
  return `<svg class="dag" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="${esc(caption)}">` +
    `<defs><marker id="${arrow}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path class="arrow" d="M0 0L10 5L0 10z"/></marker></defs>` +
    `${lines.join('')}${boxes.join('')}${labels.join('')}</svg>`;
}

const edgeLegend = '<span><i class="ln on-succeeded"></i>on succeeded</span><span><i class="ln on-failed"></i>on failed</span><span><i class="ln on-any"></i>on any end</span>';

// A job's pipeline: its upstreams and theirs, itself, its downstreams and
// theirs, from the jobs of its namespace. Empty for a job in none.
function jobPipeline(job, jobs) {
  const ns = job.namespace || 'default';
  const byName = new Map(jobs.map((j) => [j.name, j]));
  byName.set(job.name, job);
  const ups = (name) => ((byName.get(name) || {}).after || []);
  const downs = (name) => [...byName.values()].filter((j) => (j.after || []).some((e) => e.job === name)).map((j) => j.name);
  const walk = (next) => {
    const seen = new Set(), todo = [job.name];
    while (todo.length) for (const n of next(todo.pop())) if (n !== job.name && !seen.has(n)) { seen.add(n); todo.push(n); }
    return seen;
  };
  const above = walk((n) => ups(n).map((e) => e.job)), below = walk(downs);
  if (!above.size && !below.size) return '';
  const names = [...above, job.name, ...below];
  const inGraph = new Set(names);
  const edges = [];
  for (const n of names) {
    for (const e of ups(n)) {
      // Upstreams' other dependents are not drawn, nor other upstreams of
      // the job's dependents that are not upstream of the job.
      if (inGraph.has(e.job)) edges.push({ from: e.job, to: n, on: e.on });
    }
  }
  const nodes = names.map((n) => {
    const j = byName.get(n), self = n === job.name;
    const sched = j ? scheduleText(j.schedule) : '';
    const sub = !j ? 'no such job' : j.status && j.status.paused ? 'paused' : sched === 'manual' && (j.after || []).length ? 'after its upstreams' : sched;
    return { id: n, label: n, sub, title: `${n}${self ? ' (this job)' : ''}: ${sub}`, href: `#/job/${enc(ns)}/${enc(n)}`,
      cls: `job${self ? ' self' : ''}${j ? '' : ' missing'}`, attrs: { job: n, side: self ? 'self' : above.has(n) ? 'upstream' : 'downstream' } };
  });
  return `<h2>Pipeline</h2><div class="dag-box" id="pipeline">${dagSvg(nodes, edges, `pipeline of ${job.name}`)}</div>` +
    `<div class="legend dag-legend">${edgeLegend}<span>upstreams left, downstreams right; each box opens its job</span></div>`;
}

// The runs of one instant around run `r`: the graph its answer gives,
// followed through the runs it names (at most DAG.maxRuns of them are
// asked for). A job with no run at the instant is a dashed box.
async function instantRuns(r) {
  const nodes = new Map(), edges = new Map();
  const key = (g) => (g.id ? g.id : 'job:' + g.job);
  const note = (g) => { if (!nodes.has(key(g)) || g.state) nodes.set(key(g), { id: g.id || null, job: g.job, state: g.state || null }); };
  note(r);
  const asked = new Set([r.id]);
  let todo = [r], truncated = false;
  while (todo.length) {
    const next = [];
    for (const run of todo) {
      const g = run.graph || { upstream: [], downstream: [] };
      for (const u of g.upstream) { note(u); edges.set(key(u) + '\n' + run.id, { from: key(u), to: run.id, on: u.on }); }
      for (const d of g.downstream) { note(d); edges.set(run.id + '\n' + key(d), { from: run.id, to: key(d), on: d.on }); }
      for (const x of [...g.upstream, ...g.downstream]) {
        if (!x.id || asked.has(x.id)) continue;
        if (asked.size > DAG.maxRuns) { truncated = true; continue; }
        asked.add(x.id);
        next.push(x.id);
      }
    }
    const got = await Promise.all(next.map((id) => api('GET', `/v1/runs/${enc(id)}`).catch(() => null)));
    todo = got.filter(Boolean);
    todo.forEach(note);
  }
  return { nodes: [...nodes.entries()], edges: [...edges.values()], truncated };
}

async function runPipeline(r) {
  if (!r.graph) return '';
  const g = await instantRuns(r);
  const ns = r.namespace;
  const nodes = g.nodes.map(([k, n]) => {
    const state = n.state || 'none', self = n.id === r.id;
    return { id: k, label: n.job, sub: n.id ? state.replace('_', ' ') : 'no run at this instant', title: `${n.job}: ${n.id ? n.id + ' ' + state : 'no run'}${self ? ' (this run)' : ''}`,
      href: n.id ? `#/run/${enc(n.id)}` : `#/job/${enc(ns)}/${enc(n.job)}`, cls: `run rs-${state}${self ? ' self' : ''}`,
      attrs: { job: n.job, run: n.id || '', state } };
  });
  const legend = [...RUN_STATES, 'none'].map((s) => `<span><i class="sw rs-${s}"></i>${s === 'none' ? 'no run' : s}</span>`).join('');
  return `<h2>Graph of this instant</h2><div class="dag-box" id="graph">${dagSvg(nodes, g.edges, `runs of ${r.scheduled_at}`)}</div>` +
    `<div class="legend" id="graph-legend">${legend}</div><div class="legend dag-legend">${edgeLegend}</div>` +
    (g.truncated ? `<p class="mute small">The instant has more runs than the ${DAG.maxRuns} drawn here.</p>` : '');
}
