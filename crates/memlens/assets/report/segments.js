/* memlens report: the timeline filled with the cached segments, as
 * memory_viz's "Active Cached Segment Timeline" draws them: each segment (or
 * range mapped into an expandable segment) a shape from when it was made to
 * when it was released, stacked in the order they were made, each dropping
 * when one below it is released; their top is the reserved line. Hovered: its
 * address, size, stream and lifetime. Registered in window.memlensLater. */
(function () {
  'use strict';
  var later = (window.memlensLater = window.memlensLater || []);
  var PALETTE = ['#9ecae1', '#fdae6b', '#a1d99b', '#bcbddc', '#fdd0a2', '#c7e9c0', '#9e9ac8', '#fc9272'];

  later.push(['timeline', function (ML, D) {
    var G = D.segment_timeline, tl = ML.timeline, T = D.timeline;
    var sel = document.getElementById('timeline-fill');
    if (!G || !G.pieces || !G.pieces.length || !tl || !tl.events || !ML.charts.timeline) { if (sel) sel.parentNode.hidden = true; return; }
    var pieces = G.pieces, events = tl.events, fb = ML.fmtBytes;
    var first = events[0], last = events[events.length - 1];
    var mode = 'sites';

    /* Bottoms of each piece where they move: [event, bytes below it]. */
    var layout = (function () {
      // Laid out at every event a piece is made or released at.
      var items = pieces.map(function (p) { return [p[0] < 0 ? -Infinity : p[0], p[1] < 0 ? Infinity : p[1], p[2]]; });
      var at = {};
      items.forEach(function (it) { at[it[0]] = it[0]; if (it[1] !== Infinity) at[it[1]] = it[1]; });
      var keys = Object.keys(at).map(function (k) { return at[k]; }).sort(function (a, b) { return a - b; });
      return ML.stackIntervals(items, keys).bottoms;
    })();
    /* Bytes of the pieces reserved right after event e. */
    function reservedAfter(e) {
      var sum = 0;
      for (var j = 0; j < pieces.length; j++) { var p = pieces[j]; if (p[0] <= e && (p[1] < 0 || p[1] > e)) sum += p[2]; }
      return sum;
    }
    function spanOf(p) { return [p[0] < 0 ? first : p[0], p[1] < 0 ? last + 1 : p[1]]; }

    ML.drawSegmentFill = function (u) {
      if (mode !== 'segments') return;
      var ctx = u.ctx, bb = u.bbox, edge = ML.theme === 'dark' ? '#0d1117' : '#ffffff';
      var X = function (e) { return u.valToPos(e, 'x', true); }, Y = function (v) { return u.valToPos(v, 'y', true); };
      ctx.save();
      ctx.beginPath(); ctx.rect(bb.left, bb.top, bb.width, bb.height); ctx.clip();
      pieces.forEach(function (p, j) {
        var sp = spanOf(p), b = layout[j];
        if (sp[1] <= sp[0] || !b.length || !ML.traceStacked(ctx, X, Y, b, sp[0], sp[1], p[2])) return;
        ctx.fillStyle = PALETTE[j % PALETTE.length];
        ctx.fill();
        if (Y(0) - Y(p[2]) >= 3 * devicePixelRatio) { ctx.strokeStyle = edge; ctx.lineWidth = devicePixelRatio; ctx.stroke(); }
      });
      ctx.restore();
    };
    ML.segmentAt = function (u) {
      if (mode !== 'segments' || u.cursor.left == null || u.cursor.left < 0) return null;
      var e = Math.floor(u.posToVal(u.cursor.left, 'x')), bytes = u.posToVal(u.cursor.top, 'y');
      for (var j = 0; j < pieces.length; j++) {
        var p = pieces[j], sp = spanOf(p);
        if (e < sp[0] || e >= sp[1]) continue;
        var b0 = ML.bottomAt(layout[j], e);
        if (bytes < b0 || bytes >= b0 + p[2]) continue;
        var el = ML.el, box = el('div', { id: 'segment-panel' });
        box.appendChild(el('h3', { text: 'event ' + ML.fmtInt(Math.max(first, e)) + ' · one cached segment' }));
        var t = el('table');
        var row = function (k, v) { t.appendChild(el('tr', null, [el('td', { text: k }), el('td', { class: 'num', text: v })])); };
        row('size', fb(p[2]));
        row('address', '0x' + p[3].toString(16));
        row('stream', String(p[4]));
        row('made', p[0] < 0 ? 'before the trace' : 'at event ' + ML.fmtInt(p[0]));
        row('released', p[1] < 0 ? 'still reserved at the end' : 'at event ' + ML.fmtInt(p[1]));
        box.appendChild(t);
        ML.hoveredSegment = { address: p[3], size: p[2], made: p[0], released: p[1], event: e };
        return box;
      }
      return null;
    };
    function setMode(m) {
      mode = m;
      var u = ML.charts.timeline;
      for (var k = 1; k <= tl.bandSeries; k++) u.setSeries(k, { show: m === 'sites' });
      u.redraw(false);
      // What the page draws, for the browser test: the pieces, and the
      // points where their sum is not the reserved line.
      var bad = 0;
      if (m === 'segments') for (var i = 0; i < events.length; i++) if (T.reserved && reservedAfter(events[i]) !== T.reserved[i]) bad++;
      ML.segmentFill = { mode: m, pieces: pieces.length, omitted: G.omitted || 0, mismatched: bad };
    }
    sel.addEventListener('change', function () { setMode(sel.value); });
    // Drawn by event only: a time axis rebuilds the chart with the sites.
    var xSel = document.getElementById('timeline-x');
    if (xSel) xSel.addEventListener('change', function () {
      setTimeout(function () { sel.disabled = tl.isTime(); setMode(tl.isTime() ? 'sites' : sel.value); }, 0);
    });
    ML.setTimelineFill = function (m) { sel.value = m; setMode(m); };
  }]);
})();
