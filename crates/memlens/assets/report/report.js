/* memlens report: renders the JSON in #memlens-data. No network, no eval.
 * Sections whose data is absent stay hidden. window.memlens exposes what the
 * browser test checks (the uPlot instances, the flame graph's node names, ...). */
(function () {
  'use strict';

  var D = JSON.parse(document.getElementById('memlens-data').textContent || '{}');
  var ML = (window.memlens = { data: D, rendered: {}, charts: {} });

  var PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1',
    '#ff9da7', '#9c755f', '#8cd17d', '#86bcb6', '#f1ce63'];
  var OTHER_COLOR = '#c8cdd3';
  var CATEGORIES = ['parameter', 'gradient', 'optimizer_state', 'activation', 'temporary', 'input', 'other'];
  var CAT_COLOR = {
    parameter: '#4e79a7', gradient: '#f28e2b', optimizer_state: '#b07aa1', activation: '#59a14f',
    temporary: '#edc948', input: '#76b7b2', other: '#9c755f'
  };
  var STATE_NAMES = ['allocated', 'pending free', 'free'];
  /* The theme: the one the page was given (`<html data-theme>`: memlens sets
   * it when it shows the report in a notebook, from the notebook's theme),
   * else the system's. The style sheet reads the attribute. */
  var ROOT = document.documentElement;
  var DARK = ROOT.getAttribute('data-theme')
    ? ROOT.getAttribute('data-theme') === 'dark'
    : !!(window.matchMedia && window.matchMedia('(prefers-color-scheme: dark)').matches);
  ROOT.setAttribute('data-theme', DARK ? 'dark' : 'light');
  var FREE_COLOR = DARK ? '#2b323b' : '#e8ecf0';
  var FREE_EDGE = DARK ? '#46505c' : '#c3cad2';
  var INK = DARK ? '#e6edf3' : '#1f2328';
  var AXIS = DARK ? '#9aa5b1' : '#57606a';
  var GRID = DARK ? '#2d333b' : '#eef1f4';
  var SEP = DARK ? 'rgba(13,17,23,.9)' : 'rgba(255,255,255,.9)';
  ML.theme = DARK ? 'dark' : 'light';
  /* One colour per category in every chart: a site's band is a shade of its
   * category's colour (the k-th site of a category the k-th shade). */
  function shade(hexColor, k) {
    if (!k) return hexColor;
    var v = parseInt(hexColor.slice(1), 16), r = v >> 16, g = (v >> 8) & 255, b = v & 255;
    var t = [0, 0.35, -0.3, 0.6, -0.5][k % 5];
    function m(c) { return Math.round(t > 0 ? c + (255 - c) * t : c * (1 + t)); }
    return '#' + ((1 << 24) + (m(r) << 16) + (m(g) << 8) + m(b)).toString(16).slice(1);
  }
  ML.shade = shade;
  /* A site for a label: paths inside pseudo-sites ("<cuBLAS workspace: first
   * matmul at /a/b/w.py:34>") shortened to their file, the brackets kept. */
  function siteLabel(s) {
    s = String(s || '');
    if (s.charAt(0) === '<') return s.replace(/[^\s<>]*\/([^\/\s<>]+:\d+)/g, '$1');
    return basename(s);
  }
  ML.siteLabel = siteLabel;

  // ---------- helpers ----------
  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (!Object.prototype.hasOwnProperty.call(attrs, k) || attrs[k] == null) continue;
        if (k === 'text') e.textContent = attrs[k];
        else if (k === 'class') e.className = attrs[k];
        else e.setAttribute(k, attrs[k]);
      }
    }
    if (kids) kids.forEach(function (c) { if (c != null) e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
    return e;
  }
  /* Intervals stacked as memory_viz stacks allocations and segments: in the
   * order they start (ties in list order), each dropping when one below it
   * ends. items[j] = [start, end, bytes] (start -Infinity: before the first
   * key; end Infinity: never); keys: the ascending points to lay them out
   * at, every start and end among them. Gives each interval's bottoms where
   * they move ([key, bytes below it]) and the stacked bytes at each key. */
  function stackIntervals(items, keys) {
    var starts = {}, ends = {};
    items.forEach(function (it, j) {
      (starts[it[0]] = starts[it[0]] || []).push(j);
      (ends[it[1]] = ends[it[1]] || []).push(j);
    });
    var order = [], bottoms = items.map(function () { return []; }), totals = [];
    keys.forEach(function (k) {
      // Made, then let go (one made and let go at the same key is never drawn).
      (starts[k] || []).forEach(function (j) { order.push(j); });
      var gone = ends[k];
      if (gone) { var g = {}; gone.forEach(function (j) { g[j] = 1; }); order = order.filter(function (j) { return !g[j]; }); }
      var off = 0;
      order.forEach(function (j) {
        var b = bottoms[j];
        if (!b.length || b[b.length - 1][1] !== off) b.push([k, off]);
        off += items[j][2];
      });
      totals.push(off);
    });
    return { bottoms: bottoms, totals: totals };
  }
  /* The bytes below an interval at `key`, from its bottoms. */
  function bottomAt(bottoms, key) {
    var v = 0;
    for (var k = 0; k < bottoms.length && bottoms[k][0] <= key; k++) v = bottoms[k][1];
    return v;
  }
  /* Begins a canvas path around a stacked interval of `bytes` held from
   * `start` to `end`, in steps: its top edge left to right, its bottom right
   * to left (X, Y: key and bytes to canvas pixels). False when nothing of it
   * shows. */
  function traceStacked(ctx, X, Y, bottoms, start, end, bytes) {
    var top = [], bot = [];
    for (var k = 0; k < bottoms.length; k++) {
      var x0 = Math.max(start, bottoms[k][0]), x1 = k + 1 < bottoms.length ? bottoms[k + 1][0] : end;
      if (x1 <= x0) continue;
      top.push([X(x0), Y(bottoms[k][1] + bytes)], [X(x1), Y(bottoms[k][1] + bytes)]);
      bot.push([X(x0), Y(bottoms[k][1])], [X(x1), Y(bottoms[k][1])]);
    }
    if (!top.length) return false;
    ctx.beginPath();
    top.forEach(function (q, k) { if (k) ctx.lineTo(q[0], q[1]); else ctx.moveTo(q[0], q[1]); });
    for (var r = bot.length - 1; r >= 0; r--) ctx.lineTo(bot[r][0], bot[r][1]);
    ctx.closePath();
    return true;
  }
  function fmtBytes(b) {
    if (b == null || isNaN(b)) return '–';
    var neg = b < 0, v = Math.abs(b);
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    var s = i === 0 ? String(Math.round(v)) + ' B' : v.toFixed(2) + ' ' + units[i];
    return (neg ? '-' : '') + s;
  }
  function fmtShort(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0, v = Math.abs(b);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    var d = v >= 100 || Number.isInteger(v) ? 0 : v >= 10 ? 1 : 2;
    return (b < 0 ? '-' : '') + v.toFixed(d).replace(/\.0+$/, '') + ' ' + units[i];
  }
  function fmtInt(n) { return n == null ? '–' : Number(n).toLocaleString('en-US'); }
  function pct(a, b) { return b > 0 ? (100 * a / b).toFixed(a / b < 0.01 ? 2 : 1) + '%' : '–'; }
  function hex(n) { return '0x' + Number(n).toString(16); }
  function basename(p) { var i = p.lastIndexOf('/'); return i >= 0 ? p.slice(i + 1) : p; }
  /* A frame label "file:line in fn" shown as "fn (base:line)". */
  var FRAME_RE = /^(.*:\d+) in (.*)$/;
  var FOLD_RE = /^(\[\d+ library frames\] )(.*)$/;
  function shortLabel(s) {
    // A folded run of library frames keeps its count: "[36 library frames] fn (base:line)".
    var f = FOLD_RE.exec(s);
    if (f) return f[1] + shortLabel(f[2]);
    var m = FRAME_RE.exec(s);
    return m ? m[2] + ' (' + basename(m[1]) + ')' : s;
  }
  /* Text with `code` spans (as the analyses write commands and settings). */
  function richText(s) {
    var span = el('span');
    String(s).split('`').forEach(function (part, i) {
      if (part) span.appendChild(i % 2 ? el('code', { text: part }) : document.createTextNode(part));
    });
    return span;
  }
  /* A snapshot path or step label, short enough for an axis: "step11". */
  function shortPoint(s) {
    var b = basename(String(s)).replace(/\.(pickle|pkl|json)(\.(gz|zst))?$/, '');
    var m = /(?:^|[._-])(step[._-]?\d+|at_oom)$/i.exec(b);
    if (m) return m[1];
    return b.length > 16 ? '…' + b.slice(-15) : b;
  }
  function sourceBlock(line, label) {
    var num = String(line.line);
    while (num.length < 5) num = ' ' + num;
    return el('div', { class: 'source' }, [
      el('div', { class: 'muted small', text: label + ' ' + line.path + ':' + line.line }),
      el('div', { class: 'stack', text: num + ' | ' + line.text })
    ]);
  }
  function stackBlock(stack) {
    return el('div', { class: 'stack', text: stack.join('\n') });
  }
  function section(id) { var s = $(id); s.hidden = false; ML.rendered[id] = true; return s; }
  function guard(name, fn) {
    try { fn(); } catch (e) {
      console.error('memlens report: ' + name + ': ' + (e && e.stack || e));
      var s = $(name);
      if (s) { s.hidden = false; s.appendChild(el('p', { class: 'error', text: 'This section failed to draw: ' + e })); }
    }
  }

  // One tooltip shared by every chart.
  var tip = $('tip');
  function showTip(ev, nodes) {
    tip.textContent = '';
    nodes.forEach(function (n) { tip.appendChild(n); });
    tip.hidden = false;
    var pad = 14, w = tip.offsetWidth, h = tip.offsetHeight;
    var x = ev.clientX + pad, y = ev.clientY + pad;
    if (x + w > window.innerWidth - 4) x = Math.max(4, ev.clientX - w - pad);
    if (y + h > window.innerHeight - 4) y = Math.max(4, ev.clientY - h - pad);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  function hideTip() { tip.hidden = true; }
  function tipLine(label, value, mono) {
    return el('div', null, [el('span', { class: 'd', text: label + ' ' }), el(mono ? 'span' : 'b', { class: mono ? 'm' : null, text: value })]);
  }

  /* Binary tick increments for byte axes: 1, 2, 4, ... of each unit. */
  var BYTE_INCRS = (function () {
    var r = [];
    for (var u = 0; u < 5; u++) for (var m = 1; m < 1024; m *= 2) r.push(m * Math.pow(1024, u));
    return r;
  })();

  // ---------- header, verdict, about ----------
  var SECTION_TITLES = { verdict: 'Verdict', ranks: 'Ranks', overview: 'Snapshots', oom: 'OOM', timeline: 'Timeline', flame: 'Flame graph', segments: 'Segments',
    leaks: 'Leaks', tune: 'Tune', about: 'About' };
  var KIND_SECTION = { leak: 'leaks', leaks: 'leaks', peak: 'flame', fragmentation: 'segments', oom: 'oom',
    tune: 'tune', settings: 'tune', growth: 'timeline', imbalance: 'ranks' };

  function renderHeader() {
    var m = D.meta || {};
    var bits = [];
    if (m.files && m.files.length) bits.push(m.files.join(', '));
    if (m.device) bits.push(m.device);
    if (m.generated) bits.push('generated ' + m.generated.replace('T', ' ').replace('Z', ' UTC'));
    $('meta-line').textContent = bits.join(' · ');
    $('footer').textContent = 'memlens ' + (m.memlens_version || '') + ' · a self-contained report: no network needed.';
  }

  function renderVerdict() {
    var m = D.meta || {};
    var stats = $('stats');
    (m.stats || []).forEach(function (s) {
      var v = s.text != null ? s.text : fmtBytes(s.bytes);
      stats.appendChild(el('div', { class: 'stat' }, [el('div', { class: 'v', text: v }), el('div', { class: 'l', text: s.label })]));
    });
    if (!stats.childNodes.length) stats.hidden = true;
    var list = $('findings-list');
    // The verdict in one sentence, as the terminal prints it (a healthy run is told so).
    if (m.verdict) list.appendChild(el('p', { class: 'verdict', text: m.verdict }));
    var fs = (D.findings || []).slice();
    var rank = { critical: 0, warning: 1, info: 2 };
    function sevRank(f) { return Object.prototype.hasOwnProperty.call(rank, f.severity) ? rank[f.severity] : 3; }
    fs.sort(function (a, b) { return sevRank(a) - sevRank(b); });
    if (!fs.length) {
      list.appendChild(el('p', { class: 'none', text: 'No findings in this report.' }));
    }
    fs.forEach(function (f) {
      var sev = f.severity || 'info';
      var head = el('div', { class: 'head' }, [
        el('span', { class: 'badge ' + sev, text: sev }),
        f.kind ? el('span', { class: 'badge kind', text: f.kind }) : null,
        el('span', { class: 'title' }, [richText(f.title || '')]),
        f.bytes != null ? el('span', { class: 'bytes', text: fmtBytes(f.bytes) }) : null
      ]);
      var card = el('div', { class: 'finding ' + sev }, [head]);
      if (f.site) card.appendChild(el('div', { class: 'site muted' }, ['at ', el('code', { text: f.site })]));
      if (f.suggestion) card.appendChild(el('div', { class: 'fix' }, [el('b', { text: 'Fix: ' }), richText(f.suggestion)]));
      // The user's own lines, when memlens could read the source (--source-root).
      if (f.source) card.appendChild(sourceBlock(f.source, 'allocated at'));
      // What the process found holding the tensors (memlens.record's holders file).
      (f.holders || []).forEach(function (h) {
        var text = h.path + ' [' + h.kind + ']' + (h.where ? ' at ' + h.where : '') + ': ' +
          (h.bytes ? h.tensors + ' tensors, ' + fmtBytes(h.bytes) : h.tensors + ' objects') +
          (h.via && h.via.length ? ' via ' + h.via.join(' -> ') : '') + (h.root ? '; reached from ' + h.root : '') +
          (h.filled_by && h.filled_by.length ? '; filled by ' + h.filled_by.join(', ') : '');
        card.appendChild(el('div', { class: 'fix held' }, [el('b', { text: 'Held by: ' }), el('code', { text: text })]));
      });
      if (f.keeper) {
        card.appendChild(sourceBlock(f.keeper.line, 'kept alive by (the line to change)'));
        card.appendChild(el('div', { class: 'fix' }, [el('b', { text: 'Change it: ' }), richText(f.keeper.fix)]));
      }
      if (f.evidence && f.evidence.length) {
        card.appendChild(el('ul', { class: 'small' }, f.evidence.map(function (e) {
          // A long series (hundreds of values) is summarised; the whole of it one click away.
          if (String(e).length <= 600) return el('li', { text: e });
          return el('li', null, [String(e).slice(0, 400) + '… ', el('details', { class: 'inline' }, [el('summary', { text: 'all ' + String(e).length + ' characters' }), el('div', { class: 'stack', text: e })])]);
        })));
      }
      if (f.stack && f.stack.length) {
        card.appendChild(el('details', null, [el('summary', { text: 'stack (' + f.stack.length + ' frames, innermost first)' }), stackBlock(f.stack)]));
      }
      var target = KIND_SECTION[f.kind];
      if (target && D[target]) {
        card.appendChild(el('div', { class: 'see' }, [el('a', { href: '#' + target, text: 'see ' + SECTION_TITLES[target].toLowerCase() + ' →' })]));
      }
      list.appendChild(card);
    });
    ML.rendered.verdict = true;
  }

  function renderAbout() {
    var m = D.meta || {};
    var body = $('about-body');
    var dl = el('dl', { class: 'kv' });
    function row(k, v) { if (v != null && v !== '') { dl.appendChild(el('dt', { text: k })); dl.appendChild(el('dd', null, [v])); } }
    row('Files', (m.files || []).join(', '));
    row('Device', m.device);
    row('memlens', m.memlens_version);
    row('Generated', m.generated);
    (m.settings || []).forEach(function (kv) { row(kv[0], el('code', { text: String(kv[1]) })); });
    body.appendChild(dl);
    if (m.notes && m.notes.length) {
      body.appendChild(el('h3', { class: 'small', text: 'Notes' }));
      body.appendChild(el('ul', { class: 'small' }, m.notes.map(function (n) { return el('li', { text: n }); })));
    }
    body.appendChild(el('p', { class: 'muted small', text: 'Sizes are binary (1 GiB = 1024³ bytes). Stacks list the innermost frame first. The page holds aggregates only, not the snapshot.' }));
  }

  function renderNav() {
    var nav = $('nav-links');
    var missing = [];
    ['verdict', 'ranks', 'overview', 'oom', 'timeline', 'flame', 'segments', 'leaks', 'tune', 'about'].forEach(function (id) {
      if (!$(id)) return;
      if (!$(id).hidden) {
        var a = el('a', { href: '#' + id, text: SECTION_TITLES[id] });
        if (id === 'verdict') {
          var n = (D.findings || []).filter(function (f) { return f.severity === 'critical'; }).length;
          if (n) a.appendChild(el('span', { class: 'count', text: String(n) }));
        }
        nav.appendChild(a);
      } else if (!(id === 'overview' && D.ranks)) {
        // (Ranks have their own section; the per-snapshot table is left out on purpose.)
        missing.push(SECTION_TITLES[id].toLowerCase());
      }
    });
    if (missing.length) {
      var p = $('missing');
      p.textContent = 'Not available in this report: ' + missing.join(', ') + '.';
      p.hidden = false;
    }
  }

  // ---------- ranks ----------
  // One chart per rank on a shared x axis and y range: allocated (solid),
  // reserved (dashed), the imbalance site's bytes (filled), the peak marked.
  function renderRanks() {
    var R = D.ranks;
    if (!R || !R.ranks || !R.ranks.length) return;
    section('ranks');
    $('ranks-sub').textContent = R.reason || '';
    var table = $('ranks-table');
    table.appendChild(el('tr', null, ['rank', 'file', 'peak allocated', 'exact bytes', 'peak reserved', 'headroom', ''].map(function (h, k) {
      return el('th', { class: k >= 2 && k <= 5 ? 'num' : null, text: h });
    })));
    R.ranks.forEach(function (r) {
      var note = r.oom ? 'ran out of memory' : (r.closest_to_oom && R.ranks.length > 1 ? 'closest to OOM' : '');
      if (R.imbalance_rank === r.rank) note = (note ? note + '; ' : '') + 'holds ' + fmtBytes(R.imbalance_bytes) + ' more than the median rank';
      table.appendChild(el('tr', { class: R.imbalance_rank === r.rank ? 'heavy' : null }, [
        el('td', { text: String(r.rank) }),
        el('td', { class: 'shown-file', text: basename(r.file), title: r.file }),
        el('td', { class: 'num', text: fmtBytes(r.peak_allocated_bytes) }),
        el('td', { class: 'num', text: fmtInt(r.peak_allocated_bytes) }),
        el('td', { class: 'num', text: fmtBytes(r.peak_reserved_bytes) }),
        el('td', { class: 'num', text: r.headroom_bytes != null ? fmtBytes(r.headroom_bytes) : '–' }),
        el('td', { text: note })
      ]));
    });
    if (R.imbalance_site) {
      var p = $('ranks-imbalance');
      p.hidden = false;
      p.appendChild(el('span', { text: 'Imbalance site (filled in the charts): ' }));
      p.appendChild(el('code', { text: R.imbalance_site }));
      if (R.suggestion) { p.appendChild(document.createTextNode(' — ')); p.appendChild(richText(R.suggestion)); }
    }
    var S = R.series || [];
    var xmin = Infinity, xmax = -Infinity, ymax = 1;
    S.forEach(function (s) {
      if (s.x.length) { xmin = Math.min(xmin, s.x[0]); xmax = Math.max(xmax, s.x[s.x.length - 1]); }
      s.reserved.concat(s.allocated).forEach(function (v) { if (v > ymax) ymax = v; });
    });
    if (!(xmax > xmin)) { xmin = 0; xmax = 1; }
    var box = $('ranks-charts');
    var charts = [];
    S.forEach(function (s) {
      var holder = el('div', { class: 'rank-chart' });
      holder.appendChild(el('h3', { text: 'rank ' + s.rank + (R.imbalance_rank === s.rank ? ' (the heavier rank)' : '') }));
      var chartEl = el('div', { class: 'chart' });
      holder.appendChild(chartEl);
      box.appendChild(holder);
      var pk = s.peak_point;
      var opts = {
        width: Math.max(320, box.clientWidth || 800), height: 170,
        legend: { show: false },
        cursor: { sync: { key: 'memlens-ranks' }, drag: { x: false, y: false }, points: { show: false } },
        scales: { x: { time: false, range: function () { return [xmin, xmax]; } }, y: { range: function () { return [0, ymax * 1.06]; } } },
        axes: [
          { label: R.x_unit === 's' ? 'seconds since the job\'s first event' : 'event index', labelSize: 20, stroke: AXIS, grid: { stroke: GRID }, ticks: { stroke: GRID } },
          { stroke: AXIS, size: 72, incrs: BYTE_INCRS, grid: { stroke: GRID }, ticks: { stroke: GRID }, values: function (u, vals) { return vals.map(fmtShort); } }
        ],
        series: [{},
          { label: 'imbalance site', stroke: '#e15759', fill: 'rgba(225,87,89,.35)', width: 1 },
          { label: 'allocated', stroke: '#4e79a7', width: 1.5 },
          { label: 'reserved', stroke: '#8c959f', width: 1, dash: [5, 4] }],
        hooks: { draw: [function (u) {
          if (pk == null || pk >= s.x.length) return;
          var ctx = u.ctx, px = u.valToPos(s.x[pk], 'x', true);
          ctx.save();
          ctx.strokeStyle = INK; ctx.setLineDash([4, 3]); ctx.lineWidth = 1.5 * devicePixelRatio;
          ctx.beginPath(); ctx.moveTo(px, u.bbox.top); ctx.lineTo(px, u.bbox.top + u.bbox.height); ctx.stroke();
          ctx.setLineDash([]);
          ctx.font = 'bold ' + Math.round(11 * devicePixelRatio) + 'px system-ui, sans-serif';
          ctx.textAlign = 'left'; ctx.textBaseline = 'alphabetic';
          var label = 'peak ' + fmtBytes(R.ranks.filter(function (r) { return r.rank === s.rank; }).map(function (r) { return r.peak_allocated_bytes; })[0] || s.allocated[pk]);
          var tw = ctx.measureText(label).width;
          var lx = Math.max(u.bbox.left + 2, Math.min(px + 4 * devicePixelRatio, u.bbox.left + u.bbox.width - tw - 4));
          ctx.fillStyle = INK; ctx.fillText(label, lx, u.bbox.top + 13 * devicePixelRatio);
          ML.rankPeakInk = INK;
          ctx.restore();
        }] }
      };
      var data = [s.x, R.imbalance_site ? s.site_bytes : s.x.map(function () { return null; }), s.allocated, s.reserved];
      charts.push(new uPlot(opts, data, chartEl));
    });
    ML.charts.ranks = charts;
    window.addEventListener('resize', function () {
      charts.forEach(function (u) { u.setSize({ width: Math.max(320, box.clientWidth || 800), height: 170 }); });
    });
  }

  // Which file the one-snapshot sections show, when several were read.
  function renderShownFile() {
    if (!D.shown_file) return;
    ['timeline-sub', 'flame-sub', 'segments-sub'].forEach(function (id) {
      var p = $(id);
      if (!p) return;
      p.insertBefore(el('span', { class: 'shown-file', text: 'From ' + basename(D.shown_file) + '. ' }), p.firstChild);
    });
  }

  // ---------- timeline ----------
  function renderTimeline() {
    var T = D.timeline;
    if (!T || !T.x || !T.x.length) return;
    var sec = section('timeline');
    var n = T.x.length;
    var hasTime = T.x_unit === 'time_us';
    var events = T.event && T.event.length === n ? T.event : (hasTime ? null : T.x);
    // Events spread the activity evenly (a long pause, such as loading a model,
    // takes no room), so they are the default; time is one click away.
    var isTime = hasTime && !events;
    function xsFor(time) {
      var a = new Float64Array(n), t0 = T.x[0];
      for (var i = 0; i < n; i++) a[i] = time ? (T.x[i] - t0) / 1e6 : events[i];
      return a;
    }
    var xs = xsFor(isTime);
    var sites = T.sites || [];
    var bands = (T.bands || []).slice(0, sites.length);
    var hasBands = bands.length > 0;
    var hasActive = T.active && T.active.length === n;
    var other = T.other && T.other.length === n ? T.other : null;

    // Cumulative sums: cum[0] = band 0, cum[k] = band 0 + ... + band k; the last is "other" on top.
    var perCat = {};
    var layers = bands.map(function (b, k) {
      var cat = CAT_COLOR[sites[k].category] ? sites[k].category : 'other';
      var j = perCat[cat] = (perCat[cat] == null ? 0 : perCat[cat] + 1);
      return { label: sites[k].site || ('site ' + (k + 1)), raw: b, color: shade(CAT_COLOR[cat], j), site: sites[k] };
    });
    // "other sites" only when they ever hold something: a legend entry of 0 B everywhere says nothing.
    var otherMax = 0;
    if (other) for (var oi = 0; oi < n; oi++) if (other[oi] > otherMax) otherMax = other[oi];
    if (hasBands && other && otherMax > 0) layers.push({ label: 'other sites', raw: other, color: OTHER_COLOR, site: null });
    if (!hasBands) layers.push({ label: 'allocated', raw: T.allocated, color: '#9fbfdf', site: null });
    var cum = [], acc = new Float64Array(n);
    layers.forEach(function (L) {
      var c = new Float64Array(n);
      for (var i = 0; i < n; i++) { acc[i] += L.raw[i] || 0; c[i] = acc[i]; }
      cum.push(c);
    });

    // uPlot draws series in order, so draw the tallest stack first and let
    // each lower layer paint over it with an opaque fill.
    var data = [xs];
    var series = [{ label: 'x' }];
    for (var k = layers.length - 1; k >= 0; k--) {
      data.push(cum[k]);
      series.push({ label: layers[k].label, stroke: layers[k].color, fill: layers[k].color, width: 0, points: { show: false } });
    }
    data.push(T.allocated);
    series.push({ label: 'allocated', stroke: INK, width: 1.25, points: { show: false } });
    var idxReserved = data.length;
    data.push(T.reserved && T.reserved.length === n ? T.reserved : T.allocated.map(function () { return null; }));
    series.push({ label: 'reserved', stroke: '#c62828', width: 1.5, dash: [6, 4], points: { show: false } });
    var idxActive = -1;
    if (hasActive) {
      idxActive = data.length;
      data.push(T.active);
      series.push({ label: 'active', stroke: '#6f42c1', width: 1, dash: [2, 3], points: { show: false } });
    } else {
      $('timeline-active').parentNode.hidden = true;
    }

    var sub = [];
    if (hasBands) sub.push('Filled: allocated bytes of the top ' + sites.length + ' allocation sites, the rest as “other sites”.');
    sub.push('Lines: allocated (solid), reserved (dashed)' + (hasActive ? ', active (dotted)' : '') + '.');
    if (T.source_points && T.source_points > n) sub.push(fmtInt(n) + ' points shown of ' + fmtInt(T.source_points) + ' events (lows and highs of each stretch kept; peaks exact).');
    $('timeline-sub').textContent = sub.join(' ');

    var peak = T.peak != null && T.peak < n ? T.peak : null;
    var ooms = (T.ooms || []).filter(function (i) { return i < n; });

    function drawMarks(u) {
      // Served or every allocation kept, zoomed in: the exact stretch, under the marks.
      if (ML.drawDetail && !isTime) ML.drawDetail(u);
      var ctx = u.ctx;
      ctx.save();
      var top = u.bbox.top, h = u.bbox.height;
      function vline(i, color, label, dash) { vlineAt(xs[i], color, label, dash); }
      function vlineAt(xv, color, label, dash) {
        var px = u.valToPos(xv, 'x', true);
        if (px < u.bbox.left - 1 || px > u.bbox.left + u.bbox.width + 1) return;
        ctx.strokeStyle = color; ctx.lineWidth = 1.5 * devicePixelRatio; ctx.setLineDash(dash);
        ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + h); ctx.stroke();
        ctx.setLineDash([]);
        ctx.font = 'bold ' + Math.round(11 * devicePixelRatio) + 'px system-ui, sans-serif';
        // uPlot leaves its axes' alignment on the context (right, centre):
        // the clamp below places the label's left end.
        ctx.textAlign = 'left'; ctx.textBaseline = 'alphabetic';
        var tw = ctx.measureText(label).width;
        // Inside the plot at both edges: a peak at the far left or right keeps its label whole.
        var lx = Math.max(u.bbox.left + 4, Math.min(px + 4 * devicePixelRatio, u.bbox.left + u.bbox.width - tw - 4));
        ctx.fillStyle = DARK ? 'rgba(13,17,23,.85)' : 'rgba(255,255,255,.85)';
        ctx.fillRect(lx - 2, top + 2, tw + 4, 15 * devicePixelRatio);
        ctx.fillStyle = color;
        ctx.fillText(label, lx, top + 13 * devicePixelRatio);
      }
      ooms.forEach(function (i) { vline(i, '#c62828', 'OOM', []); });
      if (peak != null) vline(peak, INK, 'peak ' + fmtBytes(T.allocated[peak]), [4, 3]);
      // The moment shown below, unless it is the peak or an OOM (already marked: two labels would overlap).
      var mi = ML.momentIndex;
      // Served, the moment is an event, which a point may only stand near.
      var me = ML.moment && ML.moment.served && !isTime ? ML.moment.event : null;
      if (me != null && (mi == null || xs[mi] !== me)) vlineAt(me, '#6f42c1', 'shown below', [1, 3]);
      else if (mi != null && mi < n && mi !== peak && ooms.indexOf(mi) < 0) vline(mi, '#6f42c1', 'shown below', [1, 3]);
      ctx.restore();
    }

    var panel = $('timeline-panel');
    var lastIdx = -1, lastLayer = -2;
    function updatePanel(u) {
      var i = u.cursor.idx;
      if (i == null) return;
      // Served and zoomed in to single allocations, or filled with the
      // cached segments: the one under the cursor.
      var shape = ML.segmentAt && !isTime ? ML.segmentAt(u) : null;
      if (!shape) shape = ML.shapeAt && !isTime ? ML.shapeAt(u) : null;
      if (shape) { lastIdx = -1; panel.textContent = ''; panel.appendChild(shape); return; }
      var hot = -1;
      if (u.cursor.top != null && u.cursor.top >= 0) {
        var yv = u.posToVal(u.cursor.top, 'y');
        for (var k = 0; k < cum.length; k++) {
          if (yv <= cum[k][i] && yv >= (k ? cum[k - 1][i] : 0)) { hot = k; break; }
        }
      }
      if (i === lastIdx && hot === lastLayer) return;
      lastIdx = i; lastLayer = hot;
      panel.textContent = '';
      var xl = events ? 'event ' + fmtInt(events[i]) : '';
      if (hasTime) xl += (xl ? ' · ' : '') + ((T.x[i] - T.x[0]) / 1e6).toFixed(3) + ' s';
      panel.appendChild(el('h3', { text: xl + (i === peak ? ' · peak' : '') + (ooms.indexOf(i) >= 0 ? ' · OOM' : '') }));
      var tb = el('table');
      function trow(sw, label, v, cls, mono) {
        tb.appendChild(el('tr', { class: cls || null }, [
          el('td', null, [sw ? el('span', { class: 'sw', style: 'background:' + sw }) : null, el('span', { class: mono ? 'site' : null, text: label })]),
          el('td', { class: 'num', text: fmtBytes(v) })]));
      }
      trow(null, 'allocated', T.allocated[i], 'hot');
      if (T.reserved && T.reserved.length === n) trow(null, 'reserved', T.reserved[i]);
      if (hasActive) trow(null, 'active', T.active[i]);
      if (hasBands) {
        for (var k2 = layers.length - 1; k2 >= 0; k2--) {
          trow(layers[k2].color, layers[k2].site ? siteLabel(layers[k2].label) : layers[k2].label, layers[k2].raw[i], k2 === hot ? 'hot' : null, true);
        }
      }
      panel.appendChild(tb);
      var L = hot >= 0 ? layers[hot] : null;
      if (L && L.site) {
        panel.appendChild(el('h3', { text: 'Stack of ' + siteLabel(L.label), style: 'margin-top:8px' }));
        if (L.site.function) panel.appendChild(el('div', { class: 'muted', text: 'in ' + L.site.function + (L.site.category ? ' · ' + L.site.category.replace('_', ' ') : '') + ' · at most ' + fmtBytes(L.site.peak_bytes) }));
        if (L.site.stack && L.site.stack.length) panel.appendChild(stackBlock(L.site.stack));
      } else if (L && ML.otherSitesAt) {
        // "other sites" opened: the largest sites in it at this event.
        panel.appendChild(ML.otherSitesAt(events ? events[i] : i, sites));
      } else if (hasBands) {
        panel.appendChild(el('p', { class: 'muted', text: 'Point at a band to see its stack; click the chart to show that moment below.' }));
      }
    }

    var chartEl = $('timeline-chart');
    function width() { return Math.max(320, chartEl.clientWidth || 800); }
    function fullRange() { return { min: xs[0], max: xs[n - 1] > xs[0] ? xs[n - 1] : xs[0] + 1 }; }
    var u = null;
    function build() {
      if (u) u.destroy();
      var opts = {
        width: width(), height: 380,
        legend: { show: false },
        cursor: { drag: { x: true, y: false, setScale: true }, points: { show: false } },
        scales: { x: { time: false }, y: { range: function (u, mn, mx) { return [0, mx > 0 ? mx * 1.06 : 1]; } } },
        axes: [
          { label: isTime ? 'seconds since the first event' : 'event index in the trace', labelSize: 22, stroke: AXIS,
            grid: { stroke: GRID }, ticks: { stroke: GRID }, space: 80 },
          { stroke: AXIS, size: 72, incrs: BYTE_INCRS, grid: { stroke: GRID }, ticks: { stroke: GRID },
            values: function (u, vals) { return vals.map(fmtShort); } }
        ],
        series: series,
        // uPlot lays out after construction; place the cursor once it is ready.
        hooks: { draw: [drawMarks], setCursor: [updatePanel], ready: [function (self) { u = self; showPeak(); }],
          // Served by memlens, a zoom asks for the exact totals of the stretch (moments.js).
          setScale: [function (self, key) { if (key === 'x' && ML.onZoom) ML.onZoom(self, isTime); }],
          // The "cached segments" fill, under the lines (segments.js).
          drawClear: [function (self) { if (ML.drawSegmentFill && !isTime) ML.drawSegmentFill(self); }] }
      };
      data[0] = xs;
      u = new uPlot(opts, data, chartEl);
      u.setSeries(idxReserved, { show: $('timeline-reserved').checked });
      if (idxActive > 0) u.setSeries(idxActive, { show: $('timeline-active').checked });
      ML.charts.timeline = u;
    }
    /* Puts the cursor on the peak (or the last point), halfway up its stack. */
    function showPeak() {
      if (!u) return;
      var i = peak != null ? peak : n - 1;
      lastIdx = -1;
      u.setCursor({ left: u.valToPos(xs[i], 'x'), top: u.valToPos((T.allocated[i] || 0) * 0.5, 'y') });
      updatePanel(u);
    }
    build();
    ML.timeline = { points: n, series: data.length - 1, bandSeries: layers.length, isTime: function () { return isTime; }, showPeak: showPeak, xs: function () { return xs; }, events: events, peak: peak, ooms: ooms,
      layers: layers.map(function (L) { return { label: L.label, color: L.color, max: Math.max.apply(null, Array.prototype.slice.call(L.raw, 0, 100000)) }; }) };
    $('timeline-reset').addEventListener('click', function () { u.setScale('x', fullRange()); });
    var modeSel = $('timeline-x');
    if (hasTime && events) {
      modeSel.addEventListener('change', function () {
        isTime = modeSel.value === 'time';
        xs = xsFor(isTime);
        build();
      });
    } else {
      modeSel.parentNode.hidden = true;
    }
    $('timeline-reserved').addEventListener('change', function (e) { u.setSeries(idxReserved, { show: e.target.checked }); });
    if (idxActive > 0) $('timeline-active').addEventListener('change', function (e) { u.setSeries(idxActive, { show: e.target.checked }); });
    window.addEventListener('resize', function () { u.setSize({ width: width(), height: 380 }); });
  }

  // ---------- flame graph (icicle) ----------
  function renderFlame() {
    var F0 = D.flame;
    if (!F0 || !F0.parent || !F0.parent.length) return;
    section('flame');
    var n, parent, value, label, depth, kids, x0, total;
    var ROW = 20;
    var canvas = $('flame-canvas'), box = $('flame-box');
    var ctx = canvas.getContext('2d');
    var focus = 0, query = '', matched = null, hover = -1;
    var rows = []; // rows[d] = flat [x, w, node, ...] drawn at depth d
    ML.flame = { nodes: 0, names: [], drawn: 0, focus: function () { return focus; } };
    // Library frames (the frame rulebook's: F.library) fold into one frame
    // per run, as the terminal reads stacks, until the box is ticked.
    var showLibrary = false, shown = null, isLib = {}, foldedOf = {};
    /* The graph with each run of library frames folded into one node named
     * "[k library frames] outermost", children of equal name merged. Values
     * stay inclusive: a run's node holds its first frame's bytes. */
    function foldLibrary(F) {
      var lib = {};
      (F.library || []).forEach(function (k) { lib[k] = 1; });
      var m = Math.min(F.parent.length, F.name.length, F.value.length);
      if (!(F.library && F.library.length) || !m) return F;
      var parentN = [0], nameN = [F.name[0]], valueN = [F.value[0]], runOf = [null];
      var map = new Int32Array(m), child = {};
      for (var i = 1; i < m; i++) {
        var p = F.parent[i];
        if (p >= i) break;
        var np = map[p], libHere = lib[F.name[i]] === 1;
        if (libHere && runOf[np]) {
          // Deeper in the same run: its bytes are in the run's already.
          if (runOf[np].indexOf(F.names[F.name[i]]) < 0) runOf[np].push(F.names[F.name[i]]);
          map[i] = np;
          continue;
        }
        var key = np + '\u0000' + (libHere ? 'lib' : F.name[i]);
        var c = child[key];
        if (c == null) {
          c = child[key] = parentN.length;
          parentN.push(np); nameN.push(libHere ? -1 : F.name[i]); valueN.push(0); runOf.push(libHere ? [] : null);
        }
        valueN[c] += F.value[i];
        if (libHere && runOf[c].indexOf(F.names[F.name[i]]) < 0) runOf[c].push(F.names[F.name[i]]);
        map[i] = c;
      }
      var names = F.names.slice(), library = [], folded = {};
      for (var j = 0; j < nameN.length; j++) {
        if (nameN[j] !== -1) continue;
        var run = runOf[j];
        var lbl = run.length === 1 ? run[0] : '[' + run.length + ' library frames] ' + run[0];
        nameN[j] = names.length; names.push(lbl); library.push(nameN[j]);
        if (run.length > 1) folded[lbl] = run;
      }
      return { title: F.title, names: names, parent: parentN, name: nameN, value: valueN, library: library, folded: folded };
    }
    /* Takes a flame graph (the model's form) as the one drawn: the page's own
     * at first, one computed for a clicked moment later (ML.showFlame). */
    function load(F1) {
      shown = F1;
      var F = showLibrary ? F1 : foldLibrary(F1);
      n = Math.min(F.parent.length, F.name.length, F.value.length);
      var names = F.names || [];
      isLib = {};
      (F.library || []).forEach(function (k) { isLib[names[k]] = 1; });
      foldedOf = F.folded || {};
      parent = F.parent; value = F.value;
      label = new Array(n); depth = new Int32Array(n); kids = new Array(n); x0 = new Float64Array(n);
      for (var i = 0; i < n; i++) { label[i] = names[F.name[i]] || '?'; kids[i] = []; }
      for (i = 1; i < n; i++) {
        var p = parent[i];
        if (p >= i) { n = i; break; } // malformed: stop at the first bad node
        kids[p].push(i);
        depth[i] = depth[p] + 1;
      }
      for (i = 0; i < n; i++) {
        kids[i].sort(function (a, b) { return value[b] - value[a]; });
        var off = x0[i];
        for (var j = 0; j < kids[i].length; j++) { x0[kids[i][j]] = off; off += value[kids[i][j]]; }
      }
      total = value[0] || 0;
      $('flame-sub').textContent = (F.title ? F.title + ': ' : '') + fmtBytes(total) + ' in ' + fmtInt(n) + ' frames.';
      focus = 0; hover = -1;
      if (query) {
        matched = new Uint8Array(n);
        for (var k = 1; k < n; k++) if (label[k].toLowerCase().indexOf(query) >= 0) matched[k] = 1;
      }
      ML.flame.nodes = n; ML.flame.names = label; ML.flame.title = F.title || ''; ML.flame.total = total;
      ML.flame.libraryShown = showLibrary;
      // For the browser test: library frames whose parent is one too (none while folded).
      ML.flame.libraryRuns = function () {
        var k = 0;
        for (var i = 1; i < n; i++) if (isLib[label[i]] === 1 && isLib[label[parent[i]]] === 1) k++;
        return k;
      };
    }
    load(F0);
    $('flame-library').addEventListener('change', function (e) { showLibrary = e.target.checked; load(shown); draw(); status(); });

    /* Library frames (the rulebook's, and folded runs) are drawn in cool colours, user code in warm ones. */
    function isLibrary(s) { return isLib[s] === 1; }
    function hash(s) { var h = 2166136261; for (var i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); } return h >>> 0; }
    function color(node) {
      var s = label[node];
      if (node === 0) return '#5b6570';
      if (s === '\u2026other') return '#d5d9de';
      var h = hash(s);
      if (matched) return matched[node] ? 'hsl(' + (320 + h % 20) + ',75%,' + (52 + h % 10) + '%)' : 'hsl(210,8%,' + (82 + h % 8) + '%)';
      return isLibrary(s) ? 'hsl(' + (200 + h % 30) + ',45%,' + (72 + h % 12) + '%)' : 'hsl(' + (12 + h % 36) + ',85%,' + (62 + h % 12) + '%)';
    }
    function ancestors(node) { var a = []; while (node !== 0) { node = parent[node]; a.unshift(node); } return a; }

    function draw() {
      var dpr = window.devicePixelRatio || 1;
      var W = box.clientWidth || 800;
      var fv = value[focus] || 1, fx = x0[focus];
      var anc = ancestors(focus);
      var minW = 0.4;
      // First pass: how deep the visible part goes.
      var maxD = 0;
      var stack = [focus];
      while (stack.length) {
        var v = stack.pop();
        var w = value[v] / fv * W;
        if (w < minW) continue;
        if (depth[v] > maxD) maxD = depth[v];
        for (var c = 0; c < kids[v].length; c++) stack.push(kids[v][c]);
      }
      var H = (maxD + 1) * ROW;
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
      canvas.style.height = H + 'px';
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.font = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
      ctx.textBaseline = 'middle';
      rows = [];
      for (var d = 0; d <= maxD; d++) rows.push([]);
      var drawn = 0;
      function rect(node, x, w) {
        var d = depth[node], y = d * ROW;
        rows[d].push(x, w, node);
        drawn++;
        ctx.fillStyle = color(node);
        ctx.fillRect(x, y, Math.max(w - (w > 3 ? 1 : 0), 0.5), ROW - 1);
        if (node === hover) { ctx.strokeStyle = INK; ctx.lineWidth = 1.5; ctx.strokeRect(x + 0.75, y + 0.75, Math.max(w - 2.5, 0.5), ROW - 2.5); }
        if (w > 28) {
          var t = node === 0 ? label[0] + ' · ' + fmtBytes(value[0]) : shortLabel(label[node]);
          var maxc = Math.floor((w - 8) / 6.6);
          if (t.length > maxc) t = maxc > 2 ? t.slice(0, maxc - 1) + '…' : '';
          if (t) {
            ctx.fillStyle = (node === 0 || (matched && matched[node])) ? '#ffffff' : '#1f2328';
            ctx.fillText(t, x + 4, y + ROW / 2);
          }
        }
      }
      anc.forEach(function (a) { rect(a, 0, W); });
      stack = [focus];
      while (stack.length) {
        var v2 = stack.pop();
        var w2 = value[v2] / fv * W;
        if (w2 < minW) continue;
        rect(v2, (x0[v2] - fx) / fv * W, w2);
        for (var c2 = 0; c2 < kids[v2].length; c2++) stack.push(kids[v2][c2]);
      }
      ML.flame.drawn = drawn;
    }

    function nodeAt(ev) {
      var r = canvas.getBoundingClientRect();
      var x = ev.clientX - r.left, y = ev.clientY - r.top;
      var d = Math.floor(y / ROW);
      var row = rows[d];
      if (!row) return -1;
      for (var k = 0; k < row.length; k += 3) if (x >= row[k] && x < row[k] + Math.max(row[k + 1], 1)) return row[k + 2];
      return -1;
    }
    canvas.addEventListener('mousemove', function (ev) {
      var node = nodeAt(ev);
      if (node !== hover) { hover = node; draw(); }
      if (node < 0) { hideTip(); return; }
      var selfB = value[node];
      kids[node].forEach(function (c) { selfB -= value[c]; });
      var lines = [el('div', { class: 'm', text: label[node] }),
        tipLine('bytes', fmtBytes(value[node]) + '  (' + pct(value[node], total) + ' of all' + (focus ? ', ' + pct(value[node], value[focus]) + ' of zoom' : '') + ')'),
        tipLine('self', fmtBytes(selfB)),
        tipLine('depth', String(depth[node]))];
      // A folded run lists its frames, outermost first.
      (foldedOf[label[node]] || []).slice(0, 12).forEach(function (f, i) { lines.push(tipLine(i ? '' : 'folded', f, true)); });
      showTip(ev, lines);
    });
    canvas.addEventListener('mouseleave', function () { hover = -1; hideTip(); draw(); });
    canvas.addEventListener('click', function (ev) {
      var node = nodeAt(ev);
      if (node < 0) return;
      focus = node === focus ? parent[node] : node;
      draw();
      status();
    });
    $('flame-reset').addEventListener('click', function () { focus = 0; draw(); status(); });

    function status() {
      var s = [];
      if (focus) s.push('Zoomed on ' + shortLabel(label[focus]) + ' (' + fmtBytes(value[focus]) + ').');
      if (matched) {
        // Bytes of matching frames, not counting a match inside another match twice.
        var sum = 0, count = 0;
        for (var i = 1; i < n; i++) {
          if (!matched[i]) continue;
          count++;
          var a = parent[i], inner = false;
          while (a !== 0) { if (matched[a]) { inner = true; break; } a = parent[a]; }
          if (!inner) sum += value[i];
        }
        s.push(count ? 'Matches: ' + fmtInt(count) + ' frames, ' + fmtBytes(sum) + ' (' + pct(sum, total) + ').' : 'No frame matches “' + query + '”.');
      }
      $('flame-status').textContent = s.join(' ');
    }
    var searchTimer = 0;
    $('flame-search').addEventListener('input', function (e) {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(function () {
        query = e.target.value.trim().toLowerCase();
        if (!query) matched = null;
        else {
          matched = new Uint8Array(n);
          for (var i = 1; i < n; i++) if (label[i].toLowerCase().indexOf(query) >= 0) matched[i] = 1;
        }
        ML.flame.matches = matched ? matched.reduce(function (a, b) { return a + b; }, 0) : 0;
        draw(); status();
        ML.flame.query = query;
      }, 120);
    });
    draw();
    status();
    ML.showFlame = function (F) { load(F); draw(); status(); };
    var lastW = box.clientWidth;
    window.addEventListener('resize', function () { if (box.clientWidth !== lastW) { lastW = box.clientWidth; draw(); } });
  }

  // ---------- segment map ----------
  function renderSegments() {
    if (!D.segments || !D.segments.segments || !D.segments.segments.length) return;
    section('segments');
    var S, segs, sites, maxSize, tracks = [];
    var container = $('segments-rows');
    var legend = $('segments-legend');
    CATEGORIES.forEach(function (c) {
      legend.appendChild(el('span', null, [el('span', { class: 'sw', style: 'background:' + CAT_COLOR[c] }), c.replace('_', ' ')]));
    });
    legend.appendChild(el('span', null, [el('span', { class: 'sw', style: 'background:repeating-linear-gradient(135deg,#9c755f 0 2px,' + FREE_COLOR + ' 2px 4px)' }), 'pending free']));
    legend.appendChild(el('span', null, [el('span', { class: 'sw', style: 'background:' + FREE_COLOR + ';box-shadow:inset 0 0 0 1px ' + FREE_EDGE }), 'free']));
    /* Takes a segment map (the model's form) as the one drawn: the page's own
     * at first, a saved one for a clicked moment later (ML.showSegments). */
    function load(S1) {
    S = S1; segs = S.segments || []; sites = S.sites || [];
    var tot = 0, alloc = 0, free = 0, pend = 0, largestFree = 0;
    maxSize = 0;
    segs.forEach(function (s) {
      tot += s.size; if (s.size > maxSize) maxSize = s.size;
      (s.blocks || []).forEach(function (b) {
        if (b[3] === 0) alloc += b[1]; else if (b[3] === 1) pend += b[1]; else { free += b[1]; if (b[1] > largestFree) largestFree = b[1]; }
      });
    });
    // The totals are every segment's, drawn or not (the omitted ones are
    // the smallest; the largest free block is among the drawn ones' or theirs).
    var om = S.omitted && S.omitted.count ? S.omitted : null;
    var count = segs.length + (om ? om.count : 0);
    $('segments-sub').textContent = (S.when ? 'Segments ' + S.when + ': ' : '') + fmtInt(count) + ' segments, ' +
      fmtBytes(tot + (om ? om.bytes : 0)) + ' reserved, ' + fmtBytes(alloc + (om ? om.allocated_bytes : 0)) + ' allocated, ' +
      ((pend + (om ? om.pending_free_bytes : 0)) ? fmtBytes(pend + (om ? om.pending_free_bytes : 0)) + ' pending free, ' : '') +
      fmtBytes(free + (om ? om.free_bytes : 0)) + ' free' + (om ? '' : ' (largest free block ' + fmtBytes(largestFree) + ')') + '. ' +
      (om ? 'The ' + fmtInt(segs.length) + ' largest drawn, one row each, in address order.' : 'One row per segment, in address order.');
    if (om) {
      var o = om, p = $('segments-omitted');
      p.textContent = fmtInt(o.count) + ' smaller segments not drawn: ' + fmtBytes(o.bytes) + ' reserved, ' + fmtBytes(o.allocated_bytes) + ' allocated, ' +
        (o.pending_free_bytes ? fmtBytes(o.pending_free_bytes) + ' pending free, ' : '') + fmtBytes(o.free_bytes) + ' free.';
      p.hidden = false;
    } else {
      $('segments-omitted').hidden = true;
    }
    container.textContent = '';
    tracks = [];
    segs.forEach(function (s, si) {
      var label = el('div', { class: 'seg-label', title: hex(s.address) + ' · ' + fmtBytes(s.size) + ' · stream ' + s.stream + ' · ' + s.pool }, [
        el('span', { class: 'sz', text: fmtBytes(s.size) }), ' ', hex(s.address) + ' · ' + (s.stream ? 's' + hex(s.stream) : 'stream 0') + ' · ' + (s.pool || '')]);
      var canvas = el('canvas');
      var track = el('div', { class: 'seg-track' }, [canvas]);
      var row = el('div', { class: 'seg-row', 'data-index': String(si) }, [label, track]);
      container.appendChild(row);
      tracks.push({ seg: s, canvas: canvas, track: track });
    });
    ML.segments = { rows: segs.length, when: S.when || '', all: count };
    }
    load(D.segments);

    var patterns = {};
    function pendingPattern(ctx, color) {
      if (patterns[color]) return patterns[color];
      var c = document.createElement('canvas'); c.width = 6; c.height = 6;
      var g = c.getContext('2d');
      g.fillStyle = FREE_COLOR; g.fillRect(0, 0, 6, 6);
      g.strokeStyle = color; g.lineWidth = 2;
      g.beginPath(); g.moveTo(-1, 7); g.lineTo(7, -1); g.moveTo(-1, 1); g.lineTo(1, -1); g.moveTo(5, 7); g.lineTo(7, 5); g.stroke();
      return (patterns[color] = ctx.createPattern(c, 'repeat'));
    }
    var proportional = false;
    function drawAll() {
      var dpr = window.devicePixelRatio || 1;
      var full = tracks.length ? tracks[0].track.clientWidth : 600;
      tracks.forEach(function (t) {
        var s = t.seg;
        var W = proportional ? Math.max(2, full * s.size / maxSize) : full;
        var H = 18;
        t.width = W;
        t.canvas.width = Math.round(W * dpr); t.canvas.height = Math.round(H * dpr);
        t.canvas.style.width = W + 'px';
        var ctx = t.canvas.getContext('2d');
        ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
        ctx.fillStyle = FREE_COLOR; ctx.fillRect(0, 0, W, H);
        var scale = W / (s.size || 1);
        (s.blocks || []).forEach(function (b) {
          var x = b[0] * scale, w = Math.max(b[1] * scale, 0.6);
          var cat = CATEGORIES[b[4]] || 'other';
          if (b[3] === 2) {
            ctx.fillStyle = FREE_COLOR; ctx.fillRect(x, 0, w, H);
          } else if (b[3] === 1) {
            ctx.fillStyle = pendingPattern(ctx, CAT_COLOR[cat]); ctx.fillRect(x, 0, w, H);
          } else {
            ctx.fillStyle = CAT_COLOR[cat]; ctx.fillRect(x, 0, w, H);
          }
          if (w > 3) { ctx.fillStyle = SEP; ctx.fillRect(x + w - 1, 0, 1, H); }
        });
        ctx.strokeStyle = FREE_EDGE; ctx.lineWidth = 1; ctx.strokeRect(0.5, 0.5, W - 1, H - 1);
      });
    }
    container.addEventListener('mousemove', function (ev) {
      var c = ev.target;
      if (!(c instanceof HTMLCanvasElement)) { hideTip(); return; }
      var row = c.closest('.seg-row');
      var t = tracks[Number(row.getAttribute('data-index'))];
      if (!t) return;
      var r = c.getBoundingClientRect();
      var off = (ev.clientX - r.left) / (t.width || 1) * t.seg.size;
      var bl = t.seg.blocks || [], lo = 0, hi = bl.length - 1, hit = null;
      while (lo <= hi) {
        var mid = (lo + hi) >> 1;
        if (bl[mid][0] > off) hi = mid - 1; else { hit = bl[mid]; lo = mid + 1; }
      }
      if (!hit || off > hit[0] + hit[1]) { showTip(ev, [tipLine('segment', hex(t.seg.address) + ', ' + fmtBytes(t.seg.size)), el('div', { class: 'd', text: 'no block recorded here' })]); return; }
      var st = STATE_NAMES[hit[3]] || 'free';
      var lines = [el('div', null, [el('b', { text: (hit[6] > 1 ? fmtInt(hit[6]) + ' small blocks merged, ' : '') + st + (hit[3] !== 2 ? ' · ' + (CATEGORIES[hit[4]] || 'other').replace('_', ' ') : '') })]),
        tipLine('size', fmtBytes(hit[1]) + (hit[2] && hit[3] !== 2 ? ' (requested ' + fmtBytes(hit[2]) + ')' : '')),
        tipLine('address', hex(t.seg.address + hit[0]) + ' (offset ' + fmtBytes(hit[0]) + ')'),
        tipLine('segment', hex(t.seg.address) + ', ' + fmtBytes(t.seg.size) + ', ' + (t.seg.pool || '') + ', stream ' + t.seg.stream)];
      var site = hit[5] >= 0 ? sites[hit[5]] : null;
      if (site) {
        lines.push(tipLine('site', site.site, true));
        if (site.stack && site.stack.length) lines.push(el('div', { class: 'm d', text: site.stack.slice(0, 8).join('\n'), style: 'white-space:pre-wrap;margin-top:4px' }));
      }
      showTip(ev, lines);
    });
    container.addEventListener('mouseleave', hideTip);
    container.addEventListener('scroll', hideTip);
    $('segments-proportional').addEventListener('change', function (e) { proportional = e.target.checked; drawAll(); });
    drawAll();
    ML.showSegments = function (S2) { load(S2); drawAll(); };
    var lastW = container.clientWidth;
    window.addEventListener('resize', function () { if (container.clientWidth !== lastW) { lastW = container.clientWidth; drawAll(); } });
  }

  // ---------- leaks ----------
  function renderLeaks() {
    var L = D.leaks;
    if (!L || !L.sites || !L.sites.length) return;
    section('leaks');
    var full = L.points || [];
    var pts = full.map(shortPoint);
    var xl = L.x_label || 'step';
    $('leaks-sub').textContent = 'Live bytes of each leaking site at each ' + xl + ' (' + pts.length + ' ' + xl + 's: ' +
      (pts.length > 6 ? pts.slice(0, 3).join(', ') + ', …, ' + pts[pts.length - 1] : pts.join(', ')) + '). Most likely leak first.';
    var grid = $('leaks-grid');
    ML.charts.leaks = [];
    L.sites.forEach(function (s, k) {
      var chart = el('div');
      var card = el('div', { class: 'leak' }, [
        el('div', { class: 'site', text: s.site || '?' }),
        // bytes_per_step is growth per training step (as `memlens leaks` prints it), whatever the points are.
        el('div', { class: 'small muted' }, [(s.function ? 'in ' + s.function + ' · ' : ''), el('span', { class: 'rate', text: (s.bytes_per_step >= 0 ? '+' : '') + fmtBytes(s.bytes_per_step) + ' per step' }),
          s.confidence ? ' · confidence ' + s.confidence : null]),
        chart]);
      if (s.suggestion) card.appendChild(el('div', { class: 'small', style: 'margin-top:4px' }, [el('b', { text: 'Fix: ' }), richText(s.suggestion)]));
      // What the process found holding it (memlens.record's holders file), and the line that keeps it.
      (s.held_by || []).forEach(function (h) { card.appendChild(el('div', { class: 'small held' }, [el('b', { text: 'Held by: ' }), el('code', { text: h })])); });
      if (s.kept_by) card.appendChild(el('div', { class: 'small' }, [el('b', { text: 'Kept alive by: ' }), el('code', { text: s.kept_by })]));
      if (s.stack && s.stack.length) card.appendChild(el('details', null, [el('summary', { text: 'stack' }), stackBlock(s.stack)]));
      grid.appendChild(card);
      var xs = (s.bytes || []).map(function (_, i) { return i; });
      var color = DARK ? '#ff7b72' : '#c62828';
      var u = new uPlot({
        width: Math.max(280, chart.clientWidth || 340), height: 150,
        legend: { show: false },
        cursor: { drag: { x: false, y: false }, points: { size: 7 } },
        scales: { x: { time: false }, y: { range: function (u, mn, mx) { return [0, mx > 0 ? mx * 1.1 : 1]; } } },
        axes: [
          { stroke: AXIS, size: 30, grid: { show: false }, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], space: 70,
            values: function (u, vals) { return vals.map(function (v) { return pts[v] != null ? String(pts[v]) : ''; }); } },
          { stroke: AXIS, size: 64, incrs: BYTE_INCRS, grid: { stroke: GRID }, values: function (u, vals) { return vals.map(fmtShort); } }
        ],
        series: [{}, { label: s.site, stroke: color, fill: color + '33', width: 2, points: { show: true, size: 5, fill: color } }],
        hooks: {
          setCursor: [function (u) {
            var i = u.cursor.idx;
            if (i == null || u.cursor.left < 0) { hideTip(); return; }
            var r = u.over.getBoundingClientRect();
            showTip({ clientX: r.left + u.cursor.left, clientY: r.top + u.cursor.top }, [tipLine(xl, String(full[i] != null ? full[i] : i)), tipLine('live', fmtBytes(s.bytes[i]))]);
          }]
        }
      }, [xs, s.bytes || []], chart);
      u.over.addEventListener('mouseleave', hideTip);
      ML.charts.leaks.push(u);
    });
  }

  // ---------- tune ----------
  function renderTune() {
    var T = D.tune;
    if (!T || !T.rows || !T.rows.length) return;
    section('tune');
    $('tune-sub').textContent = 'Allocator settings simulated on this trace' + (T.device_memory ? ' with ' + fmtBytes(T.device_memory) + ' of device memory' : '') +
      ', best first. Set the winner with PYTORCH_CUDA_ALLOC_CONF before the process starts.';
    var tb = $('tune-table');
    var hasAllocs = T.rows.some(function (r) { return r.num_device_alloc != null; });
    var hasRetries = T.rows.some(function (r) { return r.num_alloc_retries != null; });
    tb.appendChild(el('thead', null, [el('tr', null, [
      el('th', { text: 'config' }), el('th', { class: 'num', text: 'peak reserved' }), el('th', { class: 'num', text: 'vs current' }),
      el('th', { class: 'num', text: 'OOMs' }),
      hasAllocs ? el('th', { class: 'num', text: 'device allocs' }) : null,
      hasRetries ? el('th', { class: 'num', text: 'alloc retries' }) : null])]));
    var body = el('tbody');
    T.rows.forEach(function (r, i) {
      var d = r.delta_bytes || 0;
      var cfg = el('td', null, [el('code', { text: r.config || '(defaults)' })]);
      if (r.current) cfg.appendChild(el('span', { class: 'badge kind', style: 'margin-left:6px', text: 'current' }));
      // "best" only where it beats the current settings: a table that marks a row best
      // under a verdict saying nothing does better would contradict it.
      if (i === 0 && !r.current && (r.delta_bytes || 0) < 0) cfg.appendChild(el('span', { class: 'badge info', style: 'margin-left:6px', text: 'best' }));
      body.appendChild(el('tr', { class: r.current ? 'current' : null }, [cfg,
        el('td', { class: 'num', text: fmtBytes(r.peak_reserved_bytes) }),
        el('td', { class: 'num ' + (r.current || d === 0 ? '' : d < 0 ? 'good' : 'bad'), text: r.current ? '—' : (d > 0 ? '+' : '') + fmtBytes(d) }),
        el('td', { class: 'num ' + (r.num_ooms ? 'bad' : ''), text: fmtInt(r.num_ooms) }),
        hasAllocs ? el('td', { class: 'num', text: fmtInt(r.num_device_alloc) }) : null,
        hasRetries ? el('td', { class: 'num ' + (r.num_alloc_retries ? 'bad' : ''), text: fmtInt(r.num_alloc_retries) }) : null]));
    });
    tb.appendChild(body);
  }

  ML.el = el; ML.fmtBytes = fmtBytes; ML.fmtInt = fmtInt; ML.section = section; ML.richText = richText; ML.stackBlock = stackBlock;
  ML.stackIntervals = stackIntervals; ML.bottomAt = bottomAt; ML.traceStacked = traceStacked;
  ML.CATEGORIES = CATEGORIES; ML.CAT_COLOR = CAT_COLOR; ML.showTip = showTip; ML.hideTip = hideTip; ML.tipLine = tipLine;
  renderHeader();
  guard('verdict', renderVerdict);
  guard('timeline', renderTimeline);
  guard('flame', renderFlame);
  guard('segments', renderSegments);
  guard('leaks', renderLeaks);
  guard('tune', renderTune);
  guard('ranks', renderRanks);
  guard('shown', renderShownFile);
  guard('about', renderAbout);
  // Sections drawn by the other scripts (moments.js, views.js) before the nav is made.
  (window.memlensLater || []).forEach(function (f) { guard(f[0], function () { f[1](ML, D); }); });
  renderNav();
  ML.ready = true;
})();
