// Keyline console: keeps figures and charts live by polling the JSON admin
// API, and shows the topic stream (server-sent events). Hand-written, no
// dependencies; the pages work without it, only not live. Values are put in
// with textContent and setAttribute, never as markup.
'use strict';
(function () {
  // Formats, as the server prints them (format.go).
  function grouped(v) { return Math.round(v).toLocaleString('en-US'); }
  function bytes(n) {
    if (n < 1024) { return grouped(n) + ' B'; }
    const units = ['KiB', 'MiB', 'GiB', 'TiB'];
    let i = -1;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return n.toFixed(1) + ' ' + units[i];
  }
  function duration(sec) {
    let s = Math.floor(sec);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    s %= 60;
    if (d > 0) { return d + 'd ' + h + 'h'; }
    if (h > 0) { return h + 'h ' + m + 'm'; }
    if (m > 0) { return m + 'm ' + s + 's'; }
    return s + 's';
  }
  const formats = {
    int: grouped,
    rate: function (v) { return v < 10 ? v.toFixed(1) : grouped(v); },
    bytes: bytes,
    bps: function (v) { return bytes(v) + '/s'; },
    dur: duration,
  };
  function format(kind, v) {
    if (v === null || v === undefined || typeof v !== 'number') { return '–'; }
    return (formats[kind] || formats.int)(v);
  }
  function field(obj, path) {
    for (const p of path.split('.')) {
      if (obj === null || obj === undefined) { return undefined; }
      obj = obj[p];
    }
    return obj;
  }

  // Charts: as chart.go draws them.
  const W = 300, H = 60, STEP = 1;
  function drawChart(fig, history) {
    const lines = fig.querySelectorAll('polyline[data-series]');
    let top = 0;
    const values = {};
    lines.forEach(function (l) {
      const key = l.getAttribute('data-series');
      let vs = history.map(function (s) { return Number(s[key]) || 0; });
      if (vs.length > W / STEP + 1) { vs = vs.slice(vs.length - W / STEP - 1); }
      values[key] = vs;
      vs.forEach(function (v) { top = Math.max(top, v); });
    });
    const scale = top > 0 ? top : 1;
    const kind = fig.getAttribute('data-format');
    const label = function (v) { return kind === 'bytes' ? bytes(v) + '/s' : format(kind, v); };
    lines.forEach(function (l) {
      const key = l.getAttribute('data-series');
      const vs = values[key];
      const pts = vs.map(function (v, i) {
        const x = W - (vs.length - 1 - i) * STEP;
        const y = H - 2 - v / scale * (H - 4);
        return x + ',' + y.toFixed(1);
      });
      l.setAttribute('points', pts.join(' '));
      const legend = fig.querySelector('[data-legend="' + key + '"] b');
      if (legend) { legend.textContent = label(vs.length ? vs[vs.length - 1] : 0); }
    });
    const max = fig.querySelector('[data-max]');
    if (max) { max.textContent = label(top); }
  }

  // The live indicator in the header.
  const live = document.getElementById('live');
  function status(text, bad) {
    if (!live) { return; }
    live.hidden = false;
    live.textContent = text;
    live.classList.toggle('bad', !!bad);
  }

  function update(section, data) {
    section.querySelectorAll('[data-k]').forEach(function (el) {
      const v = field(data, el.getAttribute('data-k'));
      el.textContent = format(el.getAttribute('data-f'), v);
    });
    section.querySelectorAll('meter[data-meter]').forEach(function (el) {
      const v = field(data, el.getAttribute('data-meter'));
      if (typeof v === 'number') { el.value = v; }
    });
    if (Array.isArray(data.history)) {
      section.querySelectorAll('figure.chart').forEach(function (fig) { drawChart(fig, data.history); });
    }
  }

  function poll(section) {
    const url = section.getAttribute('data-poll');
    const every = Number(section.getAttribute('data-every')) || 2000;
    let busy = false;
    async function tick() {
      if (busy || document.hidden) { return; }
      busy = true;
      try {
        const r = await fetch(url, { headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' });
        if (r.status === 401) {
          status('session expired: log in again', true);
          return;
        }
        if (!r.ok) {
          status('update failed: HTTP ' + r.status, true);
          return;
        }
        update(section, await r.json());
        status('live · ' + new Date().toLocaleTimeString());
      } catch (e) {
        status('broker unreachable', true);
      } finally {
        busy = false;
      }
    }
    setInterval(tick, every);
    document.addEventListener('visibilitychange', tick);
  }

  // The topic stream.
  const MAX_LINES = 500;
  function hex(bytes) {
    return Array.from(bytes, function (b) { return b.toString(16).padStart(2, '0'); }).join(' ');
  }
  // shown prints a payload as text, or as hex when it is binary or holds
  // control characters (as the server's pages do).
  const control = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/;
  function shown(m) {
    if (m.payload_encoding === 'base64') {
      return 'hex ' + hex(Uint8Array.from(atob(m.payload), function (c) { return c.charCodeAt(0); }));
    }
    return control.test(m.payload) ? 'hex ' + hex(new TextEncoder().encode(m.payload)) : m.payload;
  }
  function stream(section) {
    const list = document.getElementById('stream-lines');
    const state = document.getElementById('stream-state');
    const count = document.getElementById('stream-count');
    const skipped = document.getElementById('stream-skipped');
    const pause = document.getElementById('stream-pause');
    let lines = 0, paused = false, held = 0;
    pause.addEventListener('click', function () {
      paused = !paused;
      pause.textContent = paused ? 'Resume' : 'Pause';
    });
    document.getElementById('stream-clear').addEventListener('click', function () {
      list.replaceChildren();
    });
    const es = new EventSource(section.getAttribute('data-stream'));
    es.addEventListener('open', function () { state.textContent = 'live'; });
    es.addEventListener('error', function () {
      state.textContent = es.readyState === EventSource.CLOSED
        ? 'closed: reload to retry (a bad filter, an expired session, or the stream is off: with auth it needs the HTTP token or http-topic-user)'
        : 'reconnecting…';
    });
    es.addEventListener('closed', function (e) {
      es.close(); // a newer viewer took this one's place: reconnecting would take another's
      state.textContent = 'closed: ' + JSON.parse(e.data).error + '; reload to watch again';
    });
    es.addEventListener('stats', function (e) {
      const s = JSON.parse(e.data);
      skipped.textContent = grouped(s.skipped + held);
    });
    es.addEventListener('message', function (e) {
      if (paused) { held++; return; }
      const m = JSON.parse(e.data);
      const li = document.createElement('li');
      const topic = document.createElement('span');
      topic.className = 'topic';
      topic.textContent = m.topic;
      const payload = document.createElement('span');
      payload.className = 'payload';
      payload.textContent = shown(m);
      li.append(topic, ' ', payload);
      if (m.retain || m.truncated) {
        const note = document.createElement('span');
        note.className = 'muted';
        note.textContent = (m.retain ? ' (retained)' : '') + (m.truncated ? ' … ' + bytes(m.payload_size) : '');
        li.append(note);
      }
      list.append(li);
      while (list.childElementCount > MAX_LINES) { list.firstElementChild.remove(); }
      lines++;
      count.textContent = grouped(lines);
    });
  }

  document.querySelectorAll('section[data-poll]').forEach(poll);
  const s = document.getElementById('stream');
  if (s) { stream(s); }
})();
