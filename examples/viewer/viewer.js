// examples/viewer/viewer.js -- the viewer: a real run of the engine, step by
// step, drawn from the data the program inlined (examples/recorder.hpp).
//
// Plain JavaScript, no framework, no network: everything comes from the JSON
// in <script id="run-data">. In live mode (build/serve's /view) the records
// arrive over an event stream from the same server instead, one per step.
//
// The page, top to bottom:
//   1. the data and its schema
//   2. the run as the page keeps it: records, and each request's story
//      (its stream's pieces, its preemptions, its end), counted as they come
//   3. drawing one step: the pool, the free list, the events (each naming the
//      function, file and TUTORIAL chapter that made it), the streams, the
//      queues and block tables
//   4. the charts over the run: KV usage, queues, preemptions, inter-token gaps
//   5. moving: buttons, the slider, the keys, play, links to a step (#step=N)
//   6. live mode: the event stream
'use strict';
(function () {

// ============================================================================
// 1. The data
// ============================================================================
//
// One JSON object: the run's header and, when recorded, every step's record.
//   format      "pagedkv-view/1"
//   mode        "recorded" (build/overload --view) or "live" (build/serve /view)
//   events_url  live: the event stream to subscribe to
//   model, workload, device        what ran
//   config      {num_blocks, block_size, max_num_seqs, max_num_batched_tokens,
//                max_model_len, prefix_caching, victim, preemption, admission}
//   chapters    [{number, title}]              the TUTORIAL's chapters
//   code        {key: {function, file, chapter}}  where each kind of event is made
//   steps       [record]: one per engine step (recorded mode)
// A record:
//   step, state   the engine's step count after it; state: true for a record of
//                 the state between steps (a live page's first), not of a step
//   t0, t1        seconds from the start of the recording: schedule() and the step's end
//   chunks        [{r, n, phase, recompute, cached}]: request r computed n tokens
//                 (phase prefill, decode or recompute; recompute of them were
//                 computed before a preemption; cached: prefix-cache hits at admission)
//   events        [{kind, r, code, blocks, tokens, reason, why, t}]: admitted,
//                 resumed, preempted, waits, finished, aborted, rejected; code
//                 lists keys of the code map; blocks: the blocks it gave back
//   tokens        [[r, output index, text, gap]]: each token streamed, and the
//                 seconds since that request's previous token (null: its first)
//   running, waiting   request ids; waiting front first
//   tables        [[r, [block ids]]]  free: [block ids, head first]  cached: [block ids]
//   kv            KV cache usage, 0..1
//   totals        the engine's own running counters: {steps, preemptions,
//                 recomputed, finished, generated, rejected, aborted}
//   requests      the requests this record mentions first: [{id, prompt_len,
//                 max_tokens, prompt, arrival}]

const data = JSON.parse(document.getElementById('run-data').textContent);
const live = data.mode === 'live';
const config = data.config || {};
// A live page keeps the latest records only: a server runs for days.
const MAX_LIVE_RECORDS = 3000;

const $ = (id) => document.getElementById(id);
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
const colour = (r) => 'c' + (((r % 7) + 7) % 7);
const rname = (r) => 'r' + r;
const ms = (s) => (s * 1000).toFixed(s < 0.01 ? 2 : 1) + ' ms';

// ============================================================================
// 2. The run as the page keeps it
// ============================================================================

const run = {
  records: [],           // in order
  requests: new Map(),   // id -> its story (below)
  counted: { preemptions: 0, recomputed: 0, finished: 0 },
  dropped: 0,            // live: records the server dropped for this page (it read too slowly)
  firstTotals: null,     // live: the engine's counters when this page joined
};

// A request's story: what a client streaming it has seen, piece by piece,
// each piece tagged with the step that made it, so the stream can be shown
// as of any step.
function request(id) {
  let q = run.requests.get(id);
  if (!q) {
    q = { id, prompt_len: 0, max_tokens: 0, prompt: '', pieces: [], preempts: [], end: null };
    run.requests.set(id, q);
  }
  return q;
}

const FINISHED_OK = new Set(['stop', 'max_tokens', 'max_model_len']);

// Adds a record and counts what it says: the page's totals are its own count
// of the events, which the test compares with the engine's.
function addRecord(rec) {
  for (const q of rec.requests) Object.assign(request(q.id), q);
  if (!rec.state) {
    for (const c of rec.chunks) run.counted.recomputed += c.recompute;
  }
  for (const e of rec.events) {
    const q = request(e.r);
    if (e.kind === 'preempted') {
      run.counted.preemptions++;
      q.preempts.push(rec.step);
      q.pieces.push({ step: rec.step, mark: 'preempted' });
    } else if (e.kind === 'resumed') {
      q.pieces.push({ step: rec.step, mark: 'resumed' });
    } else if (e.kind === 'finished' || e.kind === 'aborted' || e.kind === 'rejected') {
      if (e.kind === 'finished' && FINISHED_OK.has(e.reason)) run.counted.finished++;
      q.end = { step: rec.step, kind: e.kind, reason: e.reason };
    }
  }
  for (const [r, index, text] of rec.tokens) request(r).pieces.push({ step: rec.step, index, text });
  run.records.push(rec);
  if (!run.firstTotals) run.firstTotals = rec.totals;
}

function preempted(rec) { return rec.events.some((e) => e.kind === 'preempted'); }

// ============================================================================
// 3. Drawing one step
// ============================================================================

let current = 0;  // index into run.records

function render() {
  if (!run.records.length) return;
  const rec = run.records[current];
  // The record before, when it is the step just before: what this step changed.
  const prev = current > 0 && run.records[current - 1].step === rec.step - 1 ? run.records[current - 1] : null;
  document.body.dataset.step = rec.step;
  document.body.dataset.index = current;
  $('slider').max = run.records.length - 1;
  $('slider').value = current;
  $('step-label').textContent = (rec.state ? 'state after step ' : 'step ') + rec.step + '  (' + (current + 1) + ' of ' + run.records.length + ')';
  renderPool(rec, prev);
  renderEvents(rec);
  renderStreams(rec);
  renderQueues(rec);
  charts.cursor(current);
  if (!live) {
    try { history.replaceState(null, '', '#step=' + rec.step); } catch (err) { /* a file: URL may refuse; the page works without */ }
  }
  document.body.dataset.ready = '1';
}

// The pool: one cell per block, saying who holds it or where it stands in
// the free list. Marks: C (the prefix cache can find it), + (allocated in
// this step), a dashed outline (given back in this step: by a preemption, a
// finish or an abort), with who gave it back.
//
// What to look for. A step that preempts shows the point of preemption in
// the cells themselves: the victim's blocks carry a dashed outline, and most
// of them are already held again, marked "from r15" and "+", by the requests
// whose growth failed -- the victim was freed so that they could grow, in
// the same step. Without prefix caching a freed block goes to the head of
// the free list (it holds nothing anyone can find), so it is the first one
// handed out; with prefix caching a cached block goes to the tail and is
// handed out last (core/block_pool.hpp, BlockPool::release).
function renderPool(rec, prev) {
  // Per block: who holds it now (several requests when the prefix cache
  // shares it), its place in the free list, who gave it back in this step,
  // and who held it after the step before (to mark what is new).
  const owners = new Map(), freePos = new Map(), freedBy = new Map(), before = new Map();
  for (const [r, blocks] of rec.tables) for (const b of blocks) (owners.get(b) || owners.set(b, []).get(b)).push(r);
  rec.free.forEach((b, i) => freePos.set(b, i));
  const cached = new Set(rec.cached);
  for (const e of rec.events) for (const b of e.blocks || []) freedBy.set(b, e);
  if (prev) for (const [r, blocks] of prev.tables) for (const b of blocks) (before.get(b) || before.set(b, new Set()).get(b)).add(r);
  // The cells are made once and updated in place: playing a run redraws
  // the pool many times a second.
  const pool = $('pool');
  if (pool.children.length !== config.num_blocks) {
    pool.textContent = '';
    for (let b = 0; b < config.num_blocks; b++) {
      const cell = el('div', { role: 'listitem' });
      cell.append(el('span', { class: 'bid' }), el('span', { class: 'owner' }), el('span', { class: 'note' }));
      pool.append(cell);
    }
  }
  const held = config.num_blocks - rec.free.length;
  $('pool-legend').textContent = config.num_blocks + ' blocks of ' + config.block_size + ' tokens: ' + held + ' held, ' + rec.free.length +
    ' free (KV cache usage ' + Math.round(100 * rec.kv) + '%). Each block says who holds it; a free one its place in the free list. ' +
    'C: the prefix cache can find it. +: allocated in this step. Dashed outline: given back in this step.';
  for (let b = 0; b < config.num_blocks; b++) {
    const cell = pool.children[b];
    const own = owners.get(b) || [], pos = freePos.get(b), gave = freedBy.get(b);
    const isNew = prev && own.some((r) => !(before.get(b) || new Set()).has(r));
    let cls = 'block ' + (own.length ? colour(own[0]) : 'free');
    if (cached.has(b)) cls += ' cached';
    if (gave) cls += ' freed';
    if (isNew) cls += ' new';
    cell.className = cls;
    cell.dataset.block = b;
    cell.dataset.owner = own.join(' ');
    cell.dataset.free = pos === undefined ? '' : String(pos + 1);
    cell.dataset.freedBy = gave ? String(gave.r) : '';
    cell.dataset.freedKind = gave ? gave.kind : '';
    cell.children[0].textContent = 'block ' + b;
    let owner, note = '', title;
    if (own.length) {
      owner = own.map(rname).join('+');
      title = 'block ' + b + ': held by ' + own.map((r) => 'request ' + r).join(' and ');
    } else {
      owner = 'free';
      const last = rec.free.length - 1;
      note = '#' + (pos + 1) + (pos === 0 ? ' head' : '') + (pos === last && pos > 0 ? ' tail' : '');
      title = 'block ' + b + ': free, ' + (pos + 1) + ' of ' + rec.free.length + ' in the free list';
    }
    if (gave) {
      note = 'from ' + rname(gave.r) + (own.length ? '' : ' ' + note);
      title += '; given back in this step by request ' + gave.r + ' (' + gave.kind + ')';
    } else if (isNew) {
      note = 'new';
    }
    if (cached.has(b)) title += '; the prefix cache can find its contents';
    cell.children[1].textContent = owner;
    cell.children[2].textContent = note;
    cell.title = title;
  }
  const list = $('free-list');
  list.textContent = '';
  rec.free.forEach((b, i) => {
    const gave = freedBy.get(b);
    const li = el('li', { 'data-block': b }, String(b) + (i === 0 ? ' (head)' : '') + (i === rec.free.length - 1 && i > 0 ? ' (tail)' : '') +
      (gave ? ' from ' + rname(gave.r) : ''));
    if (cached.has(b)) li.className = 'cached';
    if (gave && gave.kind === 'preempted') li.className += ' was-victim';
    list.append(li);
  });
  if (!rec.free.length) list.append(el('li', {}, 'empty: the next block a request needs must come from a victim'));
}

// The code an event came from: function, file, chapter.
function codeLine(keys) {
  const line = el('span', { class: 'code' });
  for (const k of keys) {
    const c = (data.code || {})[k];
    if (!c) continue;
    const ch = (data.chapters || []).find((x) => x.number === c.chapter);
    line.append(el('span', { 'data-code': k }, c.function + ' \u00b7 ' + c.file + ' \u00b7 chapter ' + c.chapter + (ch ? ' (' + ch.title + ')' : '')));
  }
  return line;
}

function eventItem(kind, r, headline, why, keys) {
  const li = el('li', { 'data-kind': kind, 'data-req': r === null ? '' : r });
  li.append(el('span', { class: 'kind' }, kind));
  if (r !== null) {
    const s = el('span', { class: 'swatch ' + colour(r) }, rname(r));
    li.append(s, document.createTextNode(' '));
  }
  li.append(document.createTextNode(headline));
  if (why) li.append(el('span', { class: 'why' }, why));
  li.append(codeLine(keys));
  return li;
}

// The step's story, in the order Engine::step lives it: what happened before
// it (aborts, rejections, between the steps), what schedule() decided
// (preemptions first: in a step that preempts nobody is admitted), the one
// batch of every chunk, the tokens sampled at its end, and the requests that
// finished with them. Each item names the code that made it.
function renderEvents(rec) {
  const list = $('events');
  list.textContent = '';
  const before = rec.events.filter((e) => e.t < rec.t0 - 1e-9 && !rec.state);
  const during = rec.events.filter((e) => !before.includes(e));
  const order = ['preempted', 'resumed', 'admitted', 'waits', 'finished', 'aborted', 'rejected'];
  const byPhase = { prefill: 0, decode: 0, recompute: 0 };
  let tokens = 0;
  for (const c of rec.chunks) { byPhase[c.phase] += c.n; tokens += c.n; }
  $('step-summary').textContent = rec.state
    ? 'The state between steps when this page joined; the next record is a step.'
    : 'schedule() ran ' + rec.chunks.length + ' request(s), ' + tokens + ' tokens: prefill ' + byPhase.prefill + ', decode ' + byPhase.decode +
      ', recompute ' + byPhase.recompute + '. Step time ' + ms(rec.t1 - rec.t0) + '. So far: ' + rec.totals.preemptions + ' preemption(s), ' +
      rec.totals.recomputed + ' recomputed tokens, ' + rec.totals.finished + ' finished.';
  const describe = (e, when) => {
    let headline = when;
    if (e.kind === 'finished') headline += '(' + e.reason + ')';
    if (e.blocks && e.blocks.length) headline += ' gave back blocks ' + e.blocks.join(', ');
    return eventItem(e.kind, e.r, headline, e.why, e.code);
  };
  for (const e of before) list.append(describe(e, 'before this step '));
  if (!rec.state) list.append(eventItem('scheduled', null, rec.chunks.map((c) => rname(c.r) + ' ' + c.phase + ' ' + c.n).join(', ') || 'nothing',
    'Every chunk goes into one flat batch and one forward pass.', byPhase.recompute ? ['schedule', 'step', 'recompute'] : ['schedule', 'step']));
  for (const kind of order)
    for (const e of during) if (e.kind === kind && kind !== 'finished') list.append(describe(e, ''));
  if (rec.tokens.length) {
    const shown = rec.tokens.slice(0, 8).map(([r, , text]) => rname(r) + ' "' + text + '"').join(', ');
    list.append(eventItem('tokens', null, rec.tokens.length + ' token(s) streamed: ' + shown + (rec.tokens.length > 8 ? ', ...' : ''),
      'One token for every request whose sequence is now fully computed, all at the step\'s end.', ['token']));
  }
  for (const e of during) if (e.kind === 'finished') list.append(describe(e, ''));
}

// A request's state as of a record: running, paused (preempted, waiting to
// come back), waiting (not admitted yet), or how it ended. A preempted
// request waits in the same queue as a new one (at its front); what tells
// them apart is whether it was ever preempted -- the scheduler's
// RequestState::kPreempted, which the client sees as a stream that stopped.
function stateOf(q, rec) {
  if (rec.running.includes(q.id)) return 'running';
  if (rec.waiting.includes(q.id)) return q.preempts.some((s) => s <= rec.step) ? 'paused' : 'waiting';
  if (q.end && q.end.step <= rec.step) return q.end.kind;
  return q.preempts.some((s) => s <= rec.step) ? 'paused' : 'waiting';
}

// Each stream as its client has read it up to this step: the tokens, and a
// mark where it paused. Tokens of this very step are underlined. The paused
// streams come first, then the running, the waiting and the ended ones.
const STATE_ORDER = { paused: 0, running: 1, waiting: 2 };
function renderStreams(rec) {
  const box = $('streams');
  box.textContent = '';
  const shown = [...run.requests.values()]
    .filter((q) => q.pieces.length || rec.running.includes(q.id) || rec.waiting.includes(q.id) || (q.end && q.end.step <= rec.step))
    .map((q) => ({ q, state: stateOf(q, rec) }))
    .sort((a, b) => (STATE_ORDER[a.state] ?? 3) - (STATE_ORDER[b.state] ?? 3) || a.q.id - b.q.id);
  for (const { q, state } of shown) {
    const id = q.id;
    const row = el('div', { class: 'stream', 'data-req': id, 'data-state': state });
    row.append(el('span', { class: 'swatch ' + colour(id) }, rname(id)), el('span', { class: 'state' }, state + (q.end && q.end.step <= rec.step && q.end.reason ? ' (' + q.end.reason + ')' : '')));
    const text = el('span', { class: 'text' });
    const inner = el('span');
    let pause = null;
    for (const p of q.pieces) {
      if (p.step > rec.step) break;
      if (p.mark === 'preempted') {
        pause = el('span', { class: 'pause', 'data-preempted-at': p.step }, 'paused: preempted at step ' + p.step);
        inner.append(pause);
      } else if (p.mark === 'resumed') {
        if (pause) pause.textContent += ', resumed at step ' + p.step + ' (' + (p.step - Number(pause.dataset.preemptedAt)) + ' steps)';
        pause = null;
      } else {
        const span = document.createTextNode(p.text);
        if (p.step === rec.step) { const u = el('span', { class: 'fresh' }); u.append(span); inner.append(u); } else inner.append(span);
      }
    }
    if (pause) pause.textContent += ', waiting to come back';
    text.append(inner);
    row.append(text);
    row.title = 'request ' + id + ': ' + q.prompt_len + ' prompt tokens, ' + q.max_tokens + ' max output tokens. Prompt: ' + q.prompt;
    box.append(row);
  }
}

function renderQueues(rec) {
  const chunkOf = new Map(rec.chunks.map((c) => [c.r, c]));
  const fill = (list, ids, sub) => {
    list.textContent = '';
    for (const r of ids) {
      const li = el('li', { class: colour(r), 'data-req': r }, rname(r));
      const s = sub(r);
      if (s) li.append(el('span', { class: 'sub' }, ' ' + s));
      list.append(li);
    }
    if (!ids.length) list.append(el('li', {}, '(none)'));
  };
  fill($('running'), rec.running, (r) => { const c = chunkOf.get(r); return c ? c.phase + ' ' + c.n : 'not scheduled'; });
  fill($('waiting'), rec.waiting, (r) => (stateOf(request(r), rec) === 'paused' ? 'paused' : ''));
  const body = $('tables').tBodies[0];
  body.textContent = '';
  for (const [r, blocks] of rec.tables) {
    const tr = el('tr', { 'data-req': r });
    const td = el('td');
    td.append(el('span', { class: 'swatch ' + colour(r) }, rname(r)));
    tr.append(td, el('td', { class: 'mono' }, '[' + blocks.join(' ') + ']  ' + blocks.length + ' block(s)'));
    body.append(tr);
  }
}

// ============================================================================
// 4. The charts over the run
// ============================================================================
//
// Four small SVG charts, x = record: KV cache usage; running (solid) and
// waiting (dashed); preemptions per step (bars) and in total (line); every
// inter-token gap (dots, log scale), where the p99 cliff shows.
//
// Why a log scale for the gaps: a step takes a millisecond or two, a
// preemption's pause hundreds. On a linear scale every ordinary gap would sit
// on the axis; on a log scale they form a band, and each pause is one dot far
// above it. The p50 and p99 lines are what an operator's dashboard shows
// (vLLM's inter-token latency histogram): p99 sits on the pauses, so a few
// preempted streams lift it far above the median.

// SVG elements live in SVG's namespace. Its name is a URL (never fetched);
// rather than write it here, where a check for addresses would find it, we
// ask the HTML parser, which puts an <svg> it reads in that namespace.
const SVG_NS = (function () { const d = document.createElement('div'); d.innerHTML = '<svg></svg>'; return d.firstChild.namespaceURI; })();
function svg(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}

const charts = (function () {
  const W = 420, H = 140, L = 46, R = 10, T = 20, B = 22;
  const box = $('charts');
  const list = [];
  function frame(title) {
    const s = svg('svg', { class: 'chart', viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': title });
    box.append(s);
    s.addEventListener('click', (ev) => {
      const r = s.getBoundingClientRect();
      const x = ((ev.clientX - r.left) / r.width) * W;
      go(Math.round(((x - L) / (W - L - R)) * Math.max(1, run.records.length - 1)));
    });
    const c = { s, title };
    list.push(c);
    return c;
  }
  const kv = frame('KV cache usage (%)'), queues = frame('running (solid) and waiting (dashed)');
  const pre = frame('preemptions: per step (bars), in total (line)'), gaps = frame('inter-token gaps (ms, log scale)');
  const xOf = (i) => L + (run.records.length > 1 ? (i / (run.records.length - 1)) * (W - L - R) : 0);
  function axes(c, ymax, ylabel, log) {
    c.s.textContent = '';
    c.s.append(svg('line', { class: 'axis', x1: L, y1: H - B, x2: W - R, y2: H - B }), svg('line', { class: 'axis', x1: L, y1: T, x2: L, y2: H - B }));
    const t = svg('text', { x: L, y: 13, class: 'title' });
    t.textContent = c.title;
    const top = svg('text', { x: L - 4, y: T + 4, 'text-anchor': 'end' });
    top.textContent = ylabel;
    const first = svg('text', { x: L, y: H - 8 }), last = svg('text', { x: W - R, y: H - 8, 'text-anchor': 'end' });
    first.textContent = 'step ' + (run.records.length ? run.records[0].step : '');
    last.textContent = 'step ' + (run.records.length ? run.records[run.records.length - 1].step : '');
    c.s.append(t, top, first, last);
    c.y = log ? (v) => H - B - (Math.log10(v / log.min) / Math.log10(log.max / log.min)) * (H - B - T)
              : (v) => H - B - (ymax > 0 ? v / ymax : 0) * (H - B - T);
    c.cursor = svg('line', { class: 'cursor', x1: L, y1: T, x2: L, y2: H - B });
  }
  function line(c, values, stroke, dash) {
    const d = values.map((v, i) => (i ? 'L' : 'M') + xOf(i).toFixed(1) + ' ' + c.y(v).toFixed(1)).join('');
    c.s.append(svg('path', { d, fill: 'none', stroke, 'stroke-width': 1.6, 'stroke-dasharray': dash || 'none' }));
  }
  function hline(c, v, label) {
    c.s.append(svg('line', { x1: L, x2: W - R, y1: c.y(v), y2: c.y(v), stroke: '#555', 'stroke-dasharray': '1 3' }));
    const t = svg('text', { x: W - R - 2, y: c.y(v) - 3, 'text-anchor': 'end' });
    t.textContent = label;
    c.s.append(t);
  }
  function draw() {
    const recs = run.records;
    axes(kv, 100, '100');
    line(kv, recs.map((r) => 100 * r.kv), '#0072B2');
    const qmax = Math.max(1, ...recs.map((r) => Math.max(r.running.length, r.waiting.length)));
    axes(queues, qmax, String(qmax));
    line(queues, recs.map((r) => r.running.length), '#0072B2');
    line(queues, recs.map((r) => r.waiting.length), '#D55E00', '5 3');
    const per = recs.map((r) => r.events.filter((e) => e.kind === 'preempted').length);
    const total = recs.map((r) => r.totals.preemptions - (live ? run.firstTotals.preemptions : 0));
    const pmax = Math.max(1, ...total);
    axes(pre, pmax, String(pmax));
    per.forEach((n, i) => { if (n) pre.s.append(svg('rect', { x: xOf(i) - 1.5, width: 3, y: pre.y(n), height: H - B - pre.y(n), fill: '#D55E00' })); });
    line(pre, total, '#000000');
    // Every gap, as a dot: most sit near one step's time; each preemption's
    // pause is one dot far above them.
    const dots = [];
    recs.forEach((r, i) => { for (const t of r.tokens) if (t[3] !== null && t[3] > 0) dots.push([i, t[3] * 1000]); });
    const vals = dots.map((d) => d[1]).sort((a, b) => a - b);
    const lo = vals.length ? Math.max(1e-3, vals[0]) : 0.1, hi = vals.length ? Math.max(lo * 10, vals[vals.length - 1]) : 1;
    axes(gaps, hi, hi.toFixed(hi < 10 ? 1 : 0) + ' ms', { min: lo, max: hi });
    const d = dots.map(([i, v]) => 'M' + xOf(i).toFixed(1) + ' ' + gaps.y(Math.max(lo, v)).toFixed(1) + 'h0').join('');
    gaps.s.append(svg('path', { d, stroke: '#000', 'stroke-width': 3, 'stroke-linecap': 'round', opacity: 0.5 }));
    if (vals.length) {
      const q = (p) => vals[Math.min(vals.length - 1, Math.floor((p / 100) * vals.length))];
      hline(gaps, q(50), 'p50 ' + q(50).toFixed(2) + ' ms');
      hline(gaps, q(99), 'p99 ' + q(99).toFixed(1) + ' ms (' + (q(99) / q(50)).toFixed(1) + 'x p50)');
    }
    for (const c of list) c.s.append(c.cursor);
  }
  function cursor(i) {
    for (const c of list) if (c.cursor) { c.cursor.setAttribute('x1', xOf(i)); c.cursor.setAttribute('x2', xOf(i)); }
  }
  return { draw, cursor };
})();

// ============================================================================
// 5. Moving through the run
// ============================================================================

let timer = null, follow = live;

function go(i) {
  if (!run.records.length) return;
  current = Math.max(0, Math.min(run.records.length - 1, i));
  render();
}
// Play: one step every 1/speed seconds, from the start if at the end; a live
// page keeps playing as records arrive.
function play(on) {
  if (timer) clearInterval(timer);
  timer = null;
  if (on) {
    if (current >= run.records.length - 1 && !live) go(0);
    timer = setInterval(() => {
      if (current >= run.records.length - 1) { if (!live) play(false); return; }
      go(current + 1);
    }, 1000 / Number($('speed').value));
  }
  $('btn-play').textContent = timer ? 'pause' : 'play';
}
// The next (dir 1) or previous (-1) step with a preemption.
function jumpPreemption(dir) {
  for (let i = current + dir; i >= 0 && i < run.records.length; i += dir) if (preempted(run.records[i])) return go(i);
  $('status').textContent = 'no ' + (dir > 0 ? 'later' : 'earlier') + ' preemption';
}
function userMoved() { follow = false; }

$('btn-first').addEventListener('click', () => { userMoved(); go(0); });
$('btn-prev').addEventListener('click', () => { userMoved(); go(current - 1); });
$('btn-next').addEventListener('click', () => { userMoved(); go(current + 1); });
$('btn-last').addEventListener('click', () => { follow = live; go(run.records.length - 1); });
$('btn-play').addEventListener('click', () => play(!timer));
$('btn-preemption').addEventListener('click', () => { userMoved(); jumpPreemption(1); });
$('slider').addEventListener('input', () => { userMoved(); go(Number($('slider').value)); });
$('speed').addEventListener('change', () => { if (timer) play(true); });

// The keys. Ignored while a modifier other than shift is held (the
// browser's own shortcuts), and on the slider and the speed menu, which
// handle arrows themselves.
function onKey(ev) {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const t = ev.target && ev.target.tagName;
  if (t === 'INPUT' || t === 'SELECT') return;
  const by = ev.shiftKey ? 10 : 1;
  switch (ev.key) {
    case 'ArrowRight': userMoved(); go(current + by); break;
    case 'ArrowLeft': userMoved(); go(current - by); break;
    case 'Home': userMoved(); go(0); break;
    case 'End': follow = live; go(run.records.length - 1); break;
    case ' ': if (t === 'BUTTON') return; play(!timer); break;
    case 'p': userMoved(); jumpPreemption(1); break;
    case 'P': userMoved(); jumpPreemption(-1); break;
    default: return;
  }
  ev.preventDefault();
}
document.addEventListener('keydown', onKey);

// A link to a moment: #step=N opens at step N; #keys=a,b,... then presses
// those keys, in order, as a reader would (e.g. #keys=p: the first
// preemption; #keys=End,shift+p: the last one). The test drives the page
// through these.
// (Read before the first step is drawn: drawing rewrites the address.)
const address = new URLSearchParams(location.hash.slice(1));
function fromAddress() {
  const params = address;
  const step = Number(params.get('step'));
  if (params.has('step') && Number.isFinite(step)) {
    const i = run.records.findIndex((r) => r.step >= step);
    go(i < 0 ? run.records.length - 1 : i);
  }
  // (In an address '+' reads as a space: "shift+ArrowRight" arrives as "shift ArrowRight".)
  for (const key of (params.get('keys') || '').split(',').filter(Boolean)) {
    const shifted = /^shift[+ ]/.test(key), name = key.replace(/^shift[+ ]/, '');
    const shift = shifted || (name.length === 1 && name !== name.toLowerCase());
    document.dispatchEvent(new KeyboardEvent('keydown', { key: name, shiftKey: shift, bubbles: true }));
  }
}

function showTotals() {
  const last = run.records[run.records.length - 1];
  // Recorded: the page's own count over every record. Live: the engine's
  // counters (the page may have joined late, or missed records).
  const shown = live ? { steps: last.totals.steps, preemptions: last.totals.preemptions, recomputed: last.totals.recomputed, finished: last.totals.finished }
                     : { steps: run.records.length, preemptions: run.counted.preemptions, recomputed: run.counted.recomputed, finished: run.counted.finished };
  for (const k of ['steps', 'preemptions', 'recomputed', 'finished']) {
    $('total-' + k).textContent = shown[k];
    $('total-' + k).dataset.value = shown[k];
  }
  if (!live && last) {
    const t = last.totals;
    const off = ['preemptions', 'recomputed', 'finished'].filter((k) => t[k] !== shown[k]);
    if (t.steps !== shown.steps) off.unshift('steps');
    if (off.length) $('status').textContent = 'The counts of these records differ from the engine\'s counters (' + off.join(', ') + '): records are missing.';
  }
}

function header() {
  const c = config;
  $('run-line').textContent = (data.model ? data.model + ' on ' + data.device + '. ' : '') + (data.workload ? data.workload + '. ' : '') +
    'KV cache ' + c.num_blocks + ' blocks of ' + c.block_size + ' tokens; max_num_seqs ' + c.max_num_seqs + ', max_num_batched_tokens ' +
    c.max_num_batched_tokens + '; victim ' + c.victim + ', ' + c.preemption + ', admission ' + c.admission + ', prefix caching ' +
    (c.prefix_caching ? 'on' : 'off') + '.' + (live ? ' Live from this server.' : '');
  $('chapters').textContent = 'TUTORIAL chapters: ' + (data.chapters || []).map((ch) => ch.number + ' ' + ch.title).join(' \u00b7 ');
}

// ============================================================================
// 6. Live mode: records as the server's engine makes them
// ============================================================================
//
// build/serve sends one record per step on an event stream (server-sent
// events: "state" first, then "step"; "dropped" when it had to drop records
// because this page read too slowly). The page follows the latest record
// until you move; End follows again.

function startLive() {
  const status = $('status');
  status.textContent = 'live: connecting to ' + data.events_url;
  const source = new EventSource(data.events_url);
  let pending = false;
  const take = (ev) => {
    addRecord(JSON.parse(ev.data));
    if (run.records.length > MAX_LIVE_RECORDS) {
      run.records.splice(0, run.records.length - MAX_LIVE_RECORDS);
      current = Math.max(0, current - 1);
      // Requests that ended before the oldest record kept are forgotten too.
      const oldest = run.records[0].step;
      for (const [id, q] of run.requests) if (q.end && q.end.step < oldest) run.requests.delete(id);
    }
    if (follow) current = run.records.length - 1;
    // Draw at most once a frame however fast the records come.
    if (!pending) {
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        showTotals();
        charts.draw();
        render();
        status.textContent = 'live: ' + run.records.length + ' records since this page joined' + (run.dropped ? ', ' + run.dropped + ' dropped (the page read too slowly)' : '') +
          '; this page saw ' + run.counted.preemptions + ' preemption(s)' + (follow ? '; following the latest step (move to stop, End to follow again)' : '');
      });
    }
  };
  source.addEventListener('state', take);
  source.addEventListener('step', take);
  source.addEventListener('dropped', (ev) => { run.dropped += JSON.parse(ev.data).records; });
  source.onerror = () => { status.textContent = 'live: the stream broke; reconnecting (the server may have stopped)'; };
}

header();
if (live) {
  startLive();
} else {
  for (const rec of data.steps || []) addRecord(rec);
  if (!run.records.length) $('status').textContent = 'This run has no steps.';
  showTotals();
  charts.draw();
  go(0);
  fromAddress();
}
})();
