// quantd dashboard. Reads the daemon's HTTP API on the same origin: the job list
// (/v1/jobs), live progress from the all-jobs event stream (/v1/events), one job's status,
// report and per-layer errors (/v1/jobs/{id} and its replaying stream), and the workers
// (/v1/workers). Plain DOM code, no libraries. Each job row keeps the progress values it
// has shown in data-seen, so a test can tell the bar moved.
'use strict';

const jobs = new Map();   // id -> {row, status}
let selected = null, detailStream = null, allStream = null, layerErrors = [];
// ?job=ID&once=1: close the event streams once that job has finished (for headless snapshots).
const params = new URLSearchParams(location.search);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}

function fmtEta(s) {
  if (s === undefined || s < 0) return '';
  if (s < 60) return Math.round(s) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
  return Math.floor(s / 3600) + ' h ' + Math.round((s % 3600) / 60) + ' min';
}

function setConn(ok, text) {
  const c = document.getElementById('conn');
  c.textContent = text;
  c.className = 'pill ' + (ok ? 'ok' : 'bad');
}

function rowFor(id) {
  let j = jobs.get(id);
  if (j) return j;
  const bar = el('div', {});
  const row = el('tr', {'data-id': id, 'data-seen': ''},
    el('td', {}, id), el('td', {class: 'state'}, el('span', {class: 'pill'})),
    el('td', {class: 'stage'}), el('td', {class: 'pct'}, el('span', {class: 'bar'}, bar), ' ', el('span', {class: 'num'})),
    el('td', {class: 'eta'}), el('td', {class: 'where'}));
  row.addEventListener('click', () => select(id));
  document.querySelector('#jobs tbody').prepend(row);
  document.getElementById('nojobs').hidden = true;
  j = {row, bar, status: {}};
  jobs.set(id, j);
  return j;
}

// Applies a status (from the list, an event or the job endpoint) to the job's row.
function update(st) {
  if (!st || !st.id) return;
  const j = rowFor(st.id);
  Object.assign(j.status, st);
  const s = j.status, r = j.row, p = Math.max(0, Math.min(1, s.progress || 0));
  r.dataset.state = s.state || '';
  r.dataset.progress = p.toFixed(4);
  const seen = r.dataset.seen ? r.dataset.seen.split(',') : [];
  if (seen[seen.length - 1] !== p.toFixed(4)) { seen.push(p.toFixed(4)); r.dataset.seen = seen.join(','); }
  const pill = r.querySelector('.state .pill');
  pill.textContent = s.state || '?';
  pill.className = 'pill ' + (s.state || '');
  r.querySelector('.stage').textContent = (s.stage || '') + (s.blocks ? ` ${(s.block ?? -1) + 1}/${s.blocks}` : '');
  j.bar.style.width = (p * 100).toFixed(1) + '%';
  r.querySelector('.num').textContent = (p * 100).toFixed(0) + '%';
  r.querySelector('.eta').textContent = s.state === 'running' ? fmtEta(s.eta_s) : '';
  r.querySelector('.where').textContent = [s.node, s.worker].filter(Boolean).join(' / ');
  if (selected === s.id) showDetail(s);
  if (params.get('once') && s.id === params.get('job') && ['done', 'failed', 'cancelled'].includes(s.state)) {
    if (allStream) allStream.close();
    if (detailStream) detailStream.close();
  }
}

async function getJSON(url) {
  const r = await fetch(url, {cache: 'no-store'});
  if (!r.ok) throw new Error(url + ': ' + r.status);
  return r.json();
}

async function loadJobs() {
  const f = document.getElementById('filter').value;
  try {
    const d = await getJSON('/v1/jobs' + (f ? '?state=' + encodeURIComponent(f) : ''));
    for (const [id, j] of jobs) if (f && j.status.state !== f) { j.row.remove(); jobs.delete(id); }
    for (const st of d.jobs.slice().reverse()) update(st);
    setConn(true, 'live');
  } catch (e) {
    setConn(false, 'API unreachable');
  }
}

async function loadWorkers() {
  try {
    const d = await getJSON('/v1/workers');
    document.getElementById('node').textContent = d.node ? 'node ' + d.node : '';
    const tb = document.querySelector('#workers tbody');
    tb.replaceChildren(...d.workers.map(w => el('tr', {'data-worker': w.name, 'data-state': w.state},
      el('td', {}, w.name), el('td', {}, el('span', {class: 'pill ' + (w.state === 'busy' ? 'running' : '')}, w.state)),
      el('td', {}, w.job ? `${w.job} / block ${w.block}` + (w.part >= 0 ? ` / part ${w.part}` : '') : ''), el('td', {}, String(w.pid)),
      el('td', {}, String(w.restarts)),
      el('td', {}, w.gpu_mem_total ? `${(w.gpu_mem_used / 2 ** 30).toFixed(1)} / ${(w.gpu_mem_total / 2 ** 30).toFixed(1)} GiB` : ''))));
  } catch (e) { /* the job list reports the connection state */ }
}

function showDetail(s) {
  document.getElementById('detail').hidden = false;
  document.getElementById('d-id').textContent = s.id;
  const st = document.getElementById('d-state');
  st.textContent = s.state || '';
  st.className = 'pill ' + (s.state || '');
  document.getElementById('d-bar').style.width = ((s.progress || 0) * 100).toFixed(1) + '%';
  document.getElementById('d-line').textContent = [s.stage, s.layer, s.error, s.output && 'output: ' + s.output]
    .filter(Boolean).join(' · ');
  if (s.report && Object.keys(s.report).length) {
    document.getElementById('d-report').textContent = JSON.stringify(s.report, null, 2);
    const fromReport = reportLayers(s.report);
    if (fromReport.length) drawChart(fromReport);
  }
}

// The report may list per-layer errors; otherwise the chart is built from layer events.
function reportLayers(rep) {
  const list = rep.layers || rep.layer_errors || [];
  if (!Array.isArray(list)) return [];
  return list.map(l => ({name: l.name || l.layer || '', err: l.error ?? l.err ?? l.layer_error}))
             .filter(l => typeof l.err === 'number');
}

function drawChart(points) {
  const svg = document.getElementById('chart'), W = 720, H = 220, pad = 34, NS = 'http://www.w3.org/2000/svg';
  svg.replaceChildren();
  svg.dataset.points = String(points.length);
  if (!points.length) return;
  const max = Math.max(...points.map(p => p.err), 1e-12);
  const bw = (W - pad - 8) / points.length;
  const mk = (tag, a) => { const e = document.createElementNS(NS, tag); for (const k in a) e.setAttribute(k, a[k]); return e; };
  svg.append(mk('line', {x1: pad, y1: H - 20, x2: W - 4, y2: H - 20, stroke: '#999'}));
  const t = mk('text', {x: 2, y: 12}); t.textContent = max.toPrecision(3); svg.append(t);
  points.forEach((p, i) => {
    const h = (H - 40) * (p.err / max);
    const r = mk('rect', {x: pad + i * bw + 1, y: H - 20 - h, width: Math.max(1, bw - 2), height: h, fill: '#3c78e6'});
    const tip = mk('title', {}); tip.textContent = `${p.name}: ${p.err}`; r.append(tip);
    svg.append(r);
  });
}

function select(id) {
  selected = id;
  layerErrors = [];
  drawChart([]);
  document.getElementById('d-report').textContent = '(none yet)';
  if (detailStream) detailStream.close();
  getJSON('/v1/jobs/' + encodeURIComponent(id)).then(update).catch(() => {});
  // The job's own stream replays its whole history, so the chart fills in even late.
  detailStream = new EventSource('/v1/jobs/' + encodeURIComponent(id) + '/events');
  detailStream.onmessage = m => {
    const ev = JSON.parse(m.data);
    if (ev.type === 'layer' && typeof ev.layer_error === 'number' && ev.layer_error >= 0) {
      layerErrors.push({name: ev.layer || '', err: ev.layer_error});
      if (!(jobs.get(id)?.status.report && reportLayers(jobs.get(id).status.report).length)) drawChart(layerErrors);
    }
    update(ev);
  };
}

function connectEvents() {
  const es = allStream = new EventSource('/v1/events');
  es.onopen = () => setConn(true, 'live');
  es.onmessage = m => { try { update(JSON.parse(m.data)); } catch (e) { /* not an event */ } };
  es.onerror = () => setConn(false, 'reconnecting');
}

document.getElementById('filter').addEventListener('change', loadJobs);
loadJobs();
loadWorkers();
connectEvents();
setInterval(loadJobs, 5000);
setInterval(loadWorkers, 2000);
const want = params.get('job');
if (want) select(want);
