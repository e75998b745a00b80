/* memlens report: the per-snapshot overview and the OOM drawn. Registered in
 * window.memlensLater; report.js runs them with its helpers (ML) and the data
 * (D) before it builds the navigation. */
(function () {
  'use strict';
  var later = (window.memlensLater = window.memlensLater || []);
  var SVGNS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, kids) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k) && attrs[k] != null) e.setAttribute(k, attrs[k]);
    (kids || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }
  function basename(p) { p = String(p); var i = p.lastIndexOf('/'); return i >= 0 ? p.slice(i + 1) : p; }

  // ---------- every snapshot of the run ----------
  later.push(['overview', function (ML, D) {
    var O = D.overview;
    if (!O || !O.rows || O.rows.length < 2) return;
    var el = ML.el, fb = ML.fmtBytes;
    ML.section('overview');
    var rows = O.rows;
    var last = rows[rows.length - 1];
    $id('overview-sub').textContent = rows.length + ' snapshots of one run, oldest first. The timeline, flame graph and segment map below show the last (' +
      basename(last.file) + '); the leak search reads them all, as `memlens leaks` does on the same files.';
    var hasHead = rows.some(function (r) { return r.headroom_bytes != null; });
    var t = $id('overview-table');
    t.appendChild(el('thead', null, [el('tr', null, [el('th', { text: 'snapshot' }), el('th', { class: 'num', text: 'peak allocated' }),
      el('th', { class: 'num', text: 'peak reserved' }), el('th', { class: 'num', text: 'allocated at dump' }),
      el('th', { class: 'num', text: 'growth since previous' }), hasHead ? el('th', { class: 'num', text: 'headroom' }) : null,
      el('th', { class: 'num', text: 'events' })])]));
    var body = el('tbody');
    var maxPeak = 0;
    rows.forEach(function (r) { if (r.peak_allocated_bytes > maxPeak) maxPeak = r.peak_allocated_bytes; });
    rows.forEach(function (r, i) {
      var g = r.growth_bytes || 0;
      body.appendChild(el('tr', { class: i === rows.length - 1 ? 'current' : null }, [
        el('td', { class: 'file', title: r.file }, [el('code', { text: basename(r.file) }), i === rows.length - 1 ? el('span', { class: 'badge kind', style: 'margin-left:6px', text: 'shown below' }) : null]),
        el('td', { class: 'num' + (r.peak_allocated_bytes === maxPeak ? ' strong' : ''), text: fb(r.peak_allocated_bytes) }),
        el('td', { class: 'num', text: fb(r.peak_reserved_bytes) }),
        el('td', { class: 'num', text: fb(r.allocated_bytes) }),
        el('td', { class: 'num ' + (i === 0 ? '' : g > 0 ? 'bad' : g < 0 ? 'good' : ''), text: i === 0 ? '—' : (g > 0 ? '+' : '') + fb(g) }),
        hasHead ? el('td', { class: 'num', text: r.headroom_bytes == null ? '–' : fb(r.headroom_bytes) }) : null,
        el('td', { class: 'num', text: ML.fmtInt(r.trace_events) })]));
    });
    t.appendChild(body);
    if (!hasHead) $id('overview-note').textContent = 'Headroom needs the device\'s memory, which these snapshots do not record.';
    ML.overview = { rows: rows.length };
  }]);

  // ---------- the OOM drawn ----------
  later.push(['oom', function (ML, D) {
    var O = D.oom;
    if (!O) return;
    var el = ML.el, fb = ML.fmtBytes;
    ML.section('oom');
    $id('oom-sub').textContent = 'The allocation that failed (event ' + ML.fmtInt(O.event_index) + ', ' + O.pool + ' pool, ' +
      (O.stream ? 'stream 0x' + Number(O.stream).toString(16) : 'stream 0') + (O.site ? ', at ' + O.site : '') + '), cause: ' + O.cause + '.';
    if (O.explanation) $id('oom-explain').appendChild(ML.richText(O.explanation));

    // Request against the largest free piece of each pool and stream.
    var pools = (O.pools || []).slice().sort(function (a, b) { return (b.requested_here ? 1 : 0) - (a.requested_here ? 1 : 0) || b.largest_free_bytes - a.largest_free_bytes; }).slice(0, 8);
    var bars = [{ label: 'requested', bytes: O.requested_bytes, cls: 'req' }];
    pools.forEach(function (p) {
      bars.push({ label: 'largest free, ' + p.pool + (p.stream ? ' s0x' + Number(p.stream).toString(16) : '') + (p.requested_here ? ' (this request\'s pool)' : ''),
        bytes: p.largest_free_bytes, cls: p.requested_here ? 'free here' : 'free' });
    });
    var max = 1;
    bars.forEach(function (b) { if (b.bytes > max) max = b.bytes; });
    var W = 640, LW = 250, RH = 22, H = bars.length * RH + 8;
    var chart = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, class: 'oom-bars', role: 'img', 'aria-label': 'requested bytes against the largest free piece of each pool' });
    bars.forEach(function (b, i) {
      var y = 4 + i * RH, w = Math.max(1, (W - LW - 90) * b.bytes / max);
      var t = svg('text', { x: LW - 6, y: y + 14, 'text-anchor': 'end', class: 'lbl' }); t.textContent = b.label;
      var v = svg('text', { x: LW + w + 6, y: y + 14, class: 'val' }); v.textContent = fb(b.bytes);
      chart.appendChild(svg('g', { class: 'bar ' + b.cls }, [t, svg('rect', { x: LW, y: y + 3, width: w, height: RH - 7, rx: 2 }), v]));
    });
    $id('oom-bars').appendChild(chart);

    // The device: what PyTorch held at the failure against the cap and the device.
    var total = O.device_total_bytes || 0;
    var outside = O.outside_pytorch_bytes || 0;
    var span = Math.max(total, O.cap_bytes || 0, O.reserved_bytes + outside + O.requested_bytes, 1);
    var segs = [
      { label: 'allocated', bytes: O.allocated_bytes, cls: 'alloc' },
      { label: 'reserved, not allocated', bytes: Math.max(0, O.reserved_bytes - O.allocated_bytes), cls: 'slack' },
      { label: 'outside PyTorch', bytes: outside, cls: 'outside' }
    ];
    var DW = 640, DX = 10, dev = svg('svg', { viewBox: '0 0 ' + DW + ' 70', class: 'oom-device', role: 'img', 'aria-label': 'device memory at the failure' });
    var x = DX, scale = (DW - 2 * DX) / span;
    segs.forEach(function (s) {
      if (!s.bytes) return;
      var w = s.bytes * scale;
      var r = svg('rect', { x: x, y: 14, width: Math.max(w, 1), height: 24, class: 'seg ' + s.cls });
      var tt = svg('title'); tt.textContent = s.label + ': ' + fb(s.bytes); r.appendChild(tt);
      dev.appendChild(r);
      x += w;
    });
    var req = svg('rect', { x: x, y: 14, width: Math.max(O.requested_bytes * scale, 2), height: 24, class: 'seg request' });
    var rt = svg('title'); rt.textContent = 'the request: ' + fb(O.requested_bytes); req.appendChild(rt);
    dev.appendChild(req);
    function line(bytes, label, cls) {
      var lx = DX + bytes * scale;
      dev.appendChild(svg('line', { x1: lx, x2: lx, y1: 6, y2: 46, class: 'mark ' + cls }));
      var t = svg('text', { x: Math.min(Math.max(lx, 40), DW - 40), y: 60, 'text-anchor': 'middle', class: 'mark-l ' + cls }); t.textContent = label + ' ' + fb(bytes);
      dev.appendChild(t);
    }
    if (O.cap_bytes) line(O.cap_bytes, 'cap', 'cap');
    if (total) line(total, 'device', 'device');
    $id('oom-device').appendChild(dev);
    var legend = $id('oom-legend');
    [['alloc', 'allocated ' + fb(O.allocated_bytes)], ['slack', 'reserved, not allocated ' + fb(Math.max(0, O.reserved_bytes - O.allocated_bytes))],
      ['outside', O.outside_pytorch_bytes != null ? 'outside PyTorch ' + fb(outside) : null], ['request', 'the request ' + fb(O.requested_bytes)]].forEach(function (k) {
      if (k[1]) legend.appendChild(el('span', null, [el('span', { class: 'sw oom-' + k[0] }), k[1]]));
    });
    if (!total) legend.appendChild(el('span', { class: 'muted', text: 'device size not recorded' + (O.device_free_bytes ? '; ' + fb(O.device_free_bytes) + ' free on the device at the failure' : '') }));
    if (O.cap_how) legend.appendChild(el('span', { class: 'muted' }, ['cap: ', ML.richText(O.cap_how)]));

    // What was live at the failure.
    var live = O.live || [];
    if (live.length) {
      var lt = $id('oom-live');
      lt.appendChild(el('thead', null, [el('tr', null, [el('th', { text: 'live at the failure' }), el('th', { text: 'category' }), el('th', { class: 'num', text: 'bytes' })])]));
      var lb = el('tbody');
      live.slice(0, 12).forEach(function (l) {
        lb.appendChild(el('tr', null, [el('td', null, [el('code', { text: l.site || '?' }), l.function ? ' ' + l.function : '']),
          el('td', null, [el('span', { class: 'sw', style: 'background:' + (ML.CAT_COLOR[l.category] || ML.CAT_COLOR.other) }), String(l.category || 'other').replace('_', ' ')]),
          el('td', { class: 'num', text: fb(l.bytes) })]));
      });
      if (O.other_sites) lb.appendChild(el('tr', null, [el('td', { class: 'muted', text: O.other_sites + ' more sites' }), el('td'), el('td')]));
      lt.appendChild(lb);
    }
    // Every fix with its predicted figure.
    var fixes = O.fixes || [];
    if (fixes.length) {
      var ft = $id('oom-fixes');
      ft.appendChild(el('thead', null, [el('tr', null, [el('th', { text: 'fix' }), el('th', { class: 'num', text: 'predicted peak reserved' }), el('th', { text: 'verdict' })])]));
      var fbody = el('tbody');
      fixes.forEach(function (f) {
        fbody.appendChild(el('tr', { class: f.helps ? null : 'muted' }, [el('td', null, [ML.richText(f.action)]),
          el('td', { class: 'num', text: f.predicted_peak_reserved_bytes != null ? fb(f.predicted_peak_reserved_bytes) : '–' }),
          // The terminal's tag, from the same rule (OomFix::verdict).
          el('td', { class: f.fits === true ? 'good' : f.fits === false || !f.helps ? 'bad' : 'muted', text: f.verdict })]));
      });
      ft.appendChild(fbody);
    }
    ML.oom = { bars: bars.length, requested: O.requested_bytes, largestFree: pools.length ? pools[0].largest_free_bytes : 0, fixes: fixes.length };
  }]);

  function $id(id) { return document.getElementById(id); }
})();
