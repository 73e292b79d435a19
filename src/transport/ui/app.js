// The live page of `sluice serve` (/ui/): polls /v1/policies every second and draws each
// policy's state by kind, with the last two minutes as charts (rates from the counters' deltas).
// Admin actions send the admin token typed in the header (kept for this tab only), as the
// server asks for it: `Authorization: Bearer <server.admin_token>`.
'use strict';

(() => {
  const POLL_MS = 1000;
  const HISTORY = 120; // samples kept per series: two minutes at POLL_MS
  const TOKEN_KEY = 'sluice.admin_token';

  const history = new Map(); // series key -> numbers, oldest first
  const cards = new Map(); // policy name -> {root, body, kind}
  let previous = null; // the last /v1/policies answer, with .at (ms)
  let busy = false;

  // ---- small helpers ----

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const svgNs = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs) {
    const e = document.createElementNS(svgNs, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  function fmt(n, digits = 1) {
    if (n === undefined || n === null || Number.isNaN(n)) return '-';
    if (typeof n !== 'number') return String(n);
    if (Number.isInteger(n) && Math.abs(n) < 1e6) return String(n);
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(digits) + 'G';
    if (a >= 1e6) return (n / 1e6).toFixed(digits) + 'M';
    if (a >= 1e4) return (n / 1e3).toFixed(digits) + 'k';
    return n.toFixed(a < 10 && !Number.isInteger(n) ? 2 : digits);
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  }

  function authHeaders() {
    const t = token();
    return t ? { Authorization: 'Bearer ' + t } : {};
  }

  function push(key, value) {
    let s = history.get(key);
    if (!s) history.set(key, (s = []));
    s.push(Number.isFinite(value) ? value : 0);
    if (s.length > HISTORY) s.splice(0, s.length - HISTORY);
    return s;
  }

  function values(key) {
    return history.get(key) || [];
  }

  // Per second since the last poll; 0 on the first and after a counter went back (a reload
  // that replaced the policy).
  function perSecond(now, before, seconds) {
    if (before === undefined || now === undefined || seconds <= 0) return 0;
    const d = now - before;
    return d >= 0 ? d / seconds : 0;
  }

  function stats(pairs) {
    const dl = el('dl', { class: 'stats' });
    for (const [k, v] of pairs) dl.append(el('dt', { text: k }), el('dd', { text: fmt(v) }));
    return dl;
  }

  function badge(text, tone) {
    return el('span', { class: 'badge' + (tone ? ' ' + tone : ''), text });
  }

  // A line chart of `lines` ([{label, key, dashed}]) over the last HISTORY samples.
  function chart(lines, opts = {}) {
    const W = 400, H = 120, PAD = 14;
    const box = el('div', { class: 'chart' });
    const s = svg('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none',
                           role: 'img', 'aria-label': opts.title || 'chart' });
    let max = opts.min_max || 1;
    for (const l of lines) for (const v of values(l.key)) max = Math.max(max, v);
    s.append(svg('line', { class: 'axis', x1: 0, y1: H - 1, x2: W, y2: H - 1 }));
    // The scale as text beside the drawing: the drawing stretches to its box, text would too.
    box.append(el('div', { class: 'ymax', text: fmt(max) + (opts.unit ? ' ' + opts.unit : '') }));
    lines.forEach((l, i) => {
      const v = values(l.key);
      const step = W / (HISTORY - 1);
      const x0 = (HISTORY - v.length) * step;
      const pts = v.map((y, j) =>
        `${(x0 + j * step).toFixed(1)},${(H - 1 - (y / max) * (H - PAD)).toFixed(1)}`);
      const p = svg('polyline', {
        class: `s${i % 6}` + (l.dashed ? ' limit' : ''),
        points: pts.join(' '),
        'data-series': l.label,
        'data-last': v.length ? v[v.length - 1] : 0,
      });
      s.append(p);
    });
    box.append(s);
    const legend = el('div', { class: 'legend' });
    lines.forEach((l, i) => {
      const v = values(l.key);
      legend.append(el('span', {}, el('i', { class: `s${i % 6}` }),
                       `${l.label} ${fmt(v.length ? v[v.length - 1] : 0)}`));
    });
    box.append(legend);
    return box;
  }

  function say(text, ok) {
    const m = document.getElementById('admin-message');
    m.textContent = text;
    m.className = 'message ' + (ok ? 'ok' : 'error');
  }

  async function admin(method, url, what) {
    try {
      const r = await fetch(url, { method, headers: authHeaders() });
      const body = await r.text();
      let message = body.trim();
      try {
        const j = JSON.parse(body);
        message = j.error ? j.error.message : (j.message || JSON.stringify(j));
      } catch (e) { /* not JSON: shown as it came */ }
      say(`${what}: ${r.ok ? 'done' : 'HTTP ' + r.status}${message ? ' - ' + message : ''}`, r.ok);
      return r.ok;
    } catch (e) {
      say(`${what}: ${e.message}`, false);
      return false;
    }
  }

  // ---- refusals by reason, per policy kind (the counters /v1/policies has) ----

  function refusals(p) {
    switch (p.kind) {
      case 'rate':
        return { denied: p.denied || 0 };  // key_capacity_denied: a part of it, and charges
      case 'federated':
        return p.refusals || { denied: p.denied || 0 };
      case 'adaptive': case 'concurrency': case 'fleet': case 'cascade':
        return { refused_by_limit: p.refused_by_limit || 0, refused_by_rate: p.refused_by_rate || 0 };
      case 'envoy_ratelimit':
        return { over_limit: p.over_limit || 0 };
      case 'throttler': {
        let n = 0;
        for (const a of Object.values(p.apps || {})) n += a.refused || 0;
        return { throttled: n };
      }
      default:
        return {};
    }
  }

  // ---- one card per policy ----

  function card(p) {
    let c = cards.get(p.name);
    if (c && c.kind === p.kind) return c;
    if (c) c.root.remove();
    const root = el('section', { class: 'card', 'data-policy': p.name, 'data-kind': p.kind });
    const title = el('h2', {}, p.name, el('span', { class: 'kind', text: p.kind }));
    const badges = el('span', { class: 'badges' });
    title.append(badges);
    const body = el('div', { class: 'body' });
    root.append(title, body);
    c = { root, body, badges, kind: p.kind };
    if (p.kind === 'throttler') throttlerAdmin(c, p);
    document.getElementById('policies').append(root);
    cards.set(p.name, c);
    return c;
  }

  function throttlerAdmin(c, p) {
    const app = el('input', { name: 'app', placeholder: 'app', required: true });
    const duration = el('input', { name: 'duration', value: '1h', title: 'for how long (1h, 30m)' });
    const ratio = el('input', { name: 'ratio', value: '1', title: 'share of checks refused, 0..1' });
    const form = el('form', { class: 'inline', 'data-action': 'throttle' },
                    'throttle', app, 'for', duration, 'ratio', ratio,
                    el('button', { type: 'submit', text: 'Throttle app' }));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams({ app: app.value, duration: duration.value,
                                      ratio: ratio.value, shard: p.shard || '' });
      if (await admin('POST', '/throttler/throttle-app?' + q, `throttle ${app.value}`)) tick();
    });
    c.rules = el('div', { class: 'rules' });
    c.root.append(form, c.rules);
  }

  function draw(p, before, seconds) {
    const c = card(p);
    const key = (f) => `${p.name}/${f}`;
    const rate = (f) => perSecond(p[f], before && before[f], seconds);
    c.badges.replaceChildren();
    if (p.retired) c.badges.append(badge('retired', 'warn'));
    if (p.shadow || p.shadow_mode) c.badges.append(badge('shadow', 'warn'));
    const parts = [];
    switch (p.kind) {
      case 'rate':
        push(key('allowed'), rate('allowed'));
        push(key('denied'), rate('denied'));
        parts.push(stats([['strategy', p.strategy], ['limit', p.limit], ['period s', p.period_seconds],
                          ['burst', p.burst], ['keys', p.keys], ['allowed', p.allowed],
                          ['denied', p.denied], ['charged', p.charged]]),
                   chart([{ label: 'allowed/s', key: key('allowed') },
                          { label: 'denied/s', key: key('denied') }], { title: 'decisions per second' }));
        break;
      case 'adaptive': case 'concurrency': case 'fleet': case 'cascade': {
        push(key('in_flight'), p.in_flight);
        const lines = [{ label: 'in flight', key: key('in_flight') }];
        if (p.limit !== undefined) {
          push(key('limit'), p.limit);
          lines.push({ label: 'limit', key: key('limit'), dashed: true });
        }
        if (p.kind === 'fleet') {
          push(key('l_global'), p.l_global);
          push(key('share'), p.share);
          lines.push({ label: 'L_global', key: key('l_global'), dashed: true },
                     { label: 'share', key: key('share'), dashed: true });
          c.badges.append(badge(p.phase, p.phase === 'active' ? 'good' : 'bad'));
          if (p.fenced) c.badges.append(badge('fenced', 'bad'));
          if (p.recovering) c.badges.append(badge('recovering', 'warn'));
        }
        const rows = [['in flight', p.in_flight], ['limit', p.limit], ['admitted', p.admitted],
                      ['refused (limit)', p.refused_by_limit], ['refused (rate)', p.refused_by_rate]];
        if (p.kind === 'fleet')
          rows.push(['L_global', p.l_global], ['nodes', p.nodes], ['share', p.share],
                    ['coordinator', p.coordinator]);
        if (p.kind === 'adaptive') rows.push(['algorithm', p.algorithm], ['dropped', p.dropped]);
        if (p.kind === 'concurrency')
          rows.push(['tenants', (p.tenants || []).length], ['upstreams', (p.upstreams || []).length]);
        if (p.rate) rows.push(['rate policy', p.rate]);
        parts.push(stats(rows), chart(lines, { title: 'in flight against the limit' }));
        if (p.kind === 'cascade') parts.push(cascadeNodes(p));
        break;
      }
      case 'federated': {
        for (const f of ['granted', 'spent', 'forfeited']) push(key(f), rate(f));
        const held = (p.granted || 0) - (p.spent || 0) - (p.forfeited || 0);
        parts.push(stats([['region', p.region], ['limit', p.limit], ['window s', p.window_seconds],
                          ['batch', p.batch], ['coordinator', p.coordinator], ['outage', p.outage],
                          ['escrow held', Math.max(0, held)], ['keys', p.keys],
                          ['granted', p.granted], ['spent', p.spent], ['forfeited', p.forfeited],
                          ['lease failures', p.lease_failures]]),
                   chart([{ label: 'granted/s', key: key('granted') },
                          { label: 'spent/s', key: key('spent') },
                          { label: 'forfeited/s', key: key('forfeited') }], { title: 'escrow units per second' }));
        const t = el('table', {}, el('tr', {}, el('th', { text: 'refused by reason' }),
                                     el('th', { text: 'total' }), el('th', { text: 'per second' })));
        const was = before ? refusals(before) : {};
        for (const [reason, n] of Object.entries(refusals(p)))
          t.append(el('tr', { 'data-reason': reason }, el('td', { text: reason }), el('td', { text: fmt(n) }),
                      el('td', { text: fmt(perSecond(n, was[reason], seconds)) })));
        parts.push(t);
        if (p.in_outage) c.badges.append(badge('outage', 'bad'));
        break;
      }
      case 'throttler':
        parts.push(throttlerMetrics(p), throttlerApps(p));
        c.badges.append(badge('probing ' + p.probing, p.probing === 'dormant' ? '' : 'good'));
        rules(c, p);
        break;
      case 'envoy_ratelimit':
        push(key('ok'), rate('ok'));
        push(key('over_limit'), rate('over_limit'));
        parts.push(stats([['domains', (p.domains || []).join(', ')], ['limits', p.limits],
                          ['keys', p.keys], ['ok', p.ok], ['over limit', p.over_limit],
                          ['unavailable', p.unavailable]]),
                   chart([{ label: 'ok/s', key: key('ok') },
                          { label: 'over limit/s', key: key('over_limit') }], { title: 'requests per second' }));
        break;
      default:
        parts.push(el('pre', { text: JSON.stringify(p, null, 1) }));
    }
    c.body.replaceChildren(...parts);
  }

  function cascadeNodes(p) {
    const t = el('table', { class: 'nodes' },
                 el('tr', {}, ...['node', 'success', 'weight', 'breaker', 'in flight', 'limit']
                   .map((h) => el('th', { text: h }))));
    for (const n of p.nodes || []) {
      const state = n.breaker ? n.breaker.state : '-';
      t.append(el('tr', { 'data-node': n.name },
                  el('td', { text: n.name }), el('td', { text: fmt(n.success_rate, 2) }),
                  el('td', { text: fmt(n.weight, 2) }),
                  el('td', {}, badge(state, state === 'closed' ? 'good' : state === 'open' ? 'bad' : 'warn')),
                  el('td', { text: fmt(n.in_flight) }), el('td', { text: fmt(n.limit) })));
    }
    return t;
  }

  function throttlerMetrics(p) {
    const lines = [];
    const t = el('table', {}, el('tr', {}, ...['metric', 'host', 'value', 'threshold', 'age s']
      .map((h) => el('th', { text: h }))));
    for (const m of p.metrics || []) {
      let worst = 0;
      for (const h of m.hosts || []) {
        const over = typeof h.value === 'number' && h.value > m.threshold;
        worst = Math.max(worst, typeof h.value === 'number' ? h.value : 0);
        t.append(el('tr', {}, el('td', { text: m.name }), el('td', { text: h.host }),
                    el('td', { class: over ? 'over' : '', text: h.value === undefined ? (h.error || '-') : fmt(h.value, 2) }),
                    el('td', { text: fmt(m.threshold, 2) }), el('td', { text: fmt(h.age_seconds, 1) })));
      }
      // Each metric as its share of its threshold, so metrics of different units share a chart.
      push(`${p.name}/metric/${m.name}`, m.threshold > 0 ? worst / m.threshold : 0);
      lines.push({ label: `${m.name} / threshold`, key: `${p.name}/metric/${m.name}` });
    }
    return el('div', {}, t, chart(lines, { title: 'metrics against their thresholds', min_max: 1 }));
  }

  function throttlerApps(p) {
    const apps = Object.entries(p.apps || {});
    if (!apps.length) return el('p', { class: 'muted', text: 'no app has checked yet' });
    const t = el('table', {}, el('tr', {}, ...['app', 'checks', 'refused', 'last check s ago', 'client']
      .map((h) => el('th', { text: h }))));
    for (const [name, a] of apps)
      t.append(el('tr', { 'data-app': name }, el('td', { text: name }), el('td', { text: fmt(a.checks) }),
                  el('td', { text: fmt(a.refused) }), el('td', { text: fmt(a.seconds_since_last_check, 1) }),
                  el('td', { text: a.last_client || '' })));
    return el('div', {}, el('h3', { text: 'apps' }), t);
  }

  async function rules(c, p) {
    try {
      const r = await fetch('/throttler/throttled-apps?' + new URLSearchParams({ shard: p.shard || '' }));
      if (!r.ok) return;
      const j = await r.json();
      const entries = Object.entries(j.apps || {});
      const t = el('table', {}, el('tr', {}, ...['rule', 'ratio', 'left s', '']
        .map((h) => el('th', { text: h }))));
      for (const [app, rule] of entries) {
        const q = new URLSearchParams({ app, shard: p.shard || '' });
        t.append(el('tr', { 'data-rule': app }, el('td', { text: app + (rule.exempt ? ' (exempt)' : '') }),
                    el('td', { text: fmt(rule.ratio, 2) }), el('td', { text: fmt(rule.throttled_seconds_left, 0) }),
                    el('td', {}, el('button', {
                      type: 'button', text: 'Unthrottle',
                      onclick: async () => {
                        if (await admin('POST', '/throttler/unthrottle-app?' + q, `unthrottle ${app}`)) tick();
                      },
                    }))));
      }
      c.rules.replaceChildren(entries.length ? el('h3', { text: 'rules' }) : '', entries.length ? t : '');
    } catch (e) { /* the next poll tries again */ }
  }

  // ---- the poll ----

  async function tick() {
    if (busy) return;
    busy = true;
    const status = document.getElementById('status');
    try {
      const r = await fetch('/v1/policies', { cache: 'no-store' });
      if (!r.ok) throw new Error('HTTP ' + r.status);
      const now = await r.json();
      now.at = performance.now();
      const seconds = previous ? (now.at - previous.at) / 1000 : 0;
      const before = new Map((previous ? previous.policies : []).map((p) => [p.name, p]));
      const byReason = {};
      for (const p of now.policies) {
        const was = before.get(p.name);
        const prior = was && was.kind === p.kind ? was : undefined;
        draw(p, prior, seconds);
        const old = prior ? refusals(prior) : {};
        for (const [reason, n] of Object.entries(refusals(p)))
          byReason[reason] = (byReason[reason] || 0) + perSecond(n, old[reason], prior ? seconds : 0);
      }
      const seen = new Set(now.policies.map((p) => p.name));
      for (const [name, c] of cards) if (!seen.has(name)) { c.root.remove(); cards.delete(name); }
      const lines = [];
      for (const [reason, v] of Object.entries(byReason).sort()) {
        push('refusals/' + reason, v);
        lines.push({ label: reason, key: 'refusals/' + reason });
      }
      document.getElementById('refusals-chart').replaceChildren(chart(lines, { title: 'refusals per second', unit: '/s' }));
      document.getElementById('server').textContent =
        `node ${now.node_id} · config generation ${now.generation} · ${now.leases} lease(s)` +
        (now.draining ? ' · draining' : '');
      status.textContent = 'live';
      status.className = 'status ok';
      previous = now;
    } catch (e) {
      status.textContent = 'unreachable: ' + e.message;
      status.className = 'status error';
    } finally {
      busy = false;
    }
  }

  const tokenInput = document.getElementById('token');
  tokenInput.value = token();
  tokenInput.addEventListener('change', () => sessionStorage.setItem(TOKEN_KEY, tokenInput.value));
  document.getElementById('reload').addEventListener('click', async () => {
    sessionStorage.setItem(TOKEN_KEY, tokenInput.value);
    if (await admin('POST', '/admin/reload', 'reload')) tick();
  });
  tick();
  setInterval(tick, POLL_MS);
})();
