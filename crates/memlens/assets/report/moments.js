/* memlens report: any moment inspectable. A click on the timeline redraws the
 * flame graph from the largest allocations live at that event (kept one by
 * one with their stacks; the smaller rest is one node whose bytes are the
 * timeline's allocated figure minus theirs) and the segment map saved nearest
 * to that event. Registered in window.memlensLater (see views.js). */
(function () {
  'use strict';
  var later = (window.memlensLater = window.memlensLater || []);

  later.push(['timeline', function (ML, D) {
    var M = D.moments, T = D.timeline;
    if (!M || !T || !ML.timeline || !ML.charts.timeline) return;
    var el = ML.el, fb = ML.fmtBytes;
    var allocs = M.allocs || [], stacks = M.stacks || [], frames = M.frames || [], sites = M.sites || [];
    var tl = ML.timeline;
    var events = tl.events || T.x;
    var libraryLabel = {};
    (M.library || []).forEach(function (k) { if (frames[k] != null) libraryLabel[frames[k]] = 1; });

    /* Kept allocations live right after event e, as the timeline counts them. */
    function liveAt(e) {
      var out = [];
      for (var i = 0; i < allocs.length; i++) {
        var a = allocs[i];
        if (a[0] <= e && (a[1] < 0 || a[1] > e)) out.push(a);
      }
      return out;
    }
    /* A flame graph (the model's form) of the kept blocks live at point idx. */
    function flameAt(idx, why) { return flameAtEvent(events[idx], T.allocated[idx] || 0, why); }
    /* Every allocation is kept (a small trace): the page alone is exact at
     * any event, between its points too. */
    var allKept = !M.min_kept_bytes && allocs.length > 0;
    /* Bytes of the kept allocations live right after event e. */
    function keptBytesAt(e) { var b = 0; liveAt(e).forEach(function (a) { b += a[2]; }); return b; }
    function flameAtEvent(e, allocated, why) {
      var live = liveAt(e);
      var names = ['all live memory'], nameId = { 'all live memory': 0 };
      var parent = [0], name = [0], value = [0], child = {};
      function nid(s) { if (!(s in nameId)) { nameId[s] = names.length; names.push(s); } return nameId[s]; }
      function node(p, s) {
        var key = p + '\u0000' + s;
        var c = child[key];
        if (c == null) { c = child[key] = parent.length; parent.push(p); name.push(nid(s)); value.push(0); }
        return c;
      }
      var kept = 0;
      live.forEach(function (a) {
        var size = a[2], path;
        if (a[4] >= 0 && stacks[a[4]]) path = stacks[a[4]].map(function (f) { return frames[f] || '?'; }).reverse();
        else path = [sites[a[5]] || '<no stack>'];
        kept += size;
        value[0] += size;
        var p = 0;
        for (var k = 0; k < path.length; k++) { p = node(p, path[k]); value[p] += size; }
      });
      var rest = allocated - kept;
      if (rest > 0) {
        var r = node(0, '…smaller allocations' + (M.min_kept_bytes ? ' (under ' + fb(M.min_kept_bytes) + ', not kept one by one)' : ''));
        value[r] += rest; value[0] += rest;
      }
      // The library frames among this graph's names, by the moments' list.
      var library = [];
      names.forEach(function (s, k) { if (libraryLabel[s]) library.push(k); });
      return { title: 'live at event ' + ML.fmtInt(e) + (why ? ' (' + why + ')' : ''), names: names, parent: parent, name: name, value: value, library: library, kept: kept, rest: Math.max(rest, 0) };
    }
    /* The saved segment map nearest to event e. */
    function segmentsAt(e) {
      var ev = M.segment_events || [], best = -1;
      for (var i = 0; i < ev.length; i++) if (best < 0 || Math.abs(ev[i] - e) < Math.abs(ev[best] - e)) best = i;
      if (best < 0) return null;
      var S = M.segment_maps[best];
      var copy = {};
      for (var k in S) if (Object.prototype.hasOwnProperty.call(S, k)) copy[k] = S[k];
      copy.when = ev[best] === e ? 'at event ' + ML.fmtInt(e) : 'at event ' + ML.fmtInt(ev[best]) + ' (the nearest of ' + ev.length + ' saved moments to event ' + ML.fmtInt(e) + ')';
      copy.event = ev[best];
      return copy;
    }
    function why(idx) {
      if (idx === tl.peak) return 'the peak';
      if ((tl.ooms || []).indexOf(idx) >= 0) return 'the OOM';
      return '';
    }
    /* Shows timeline point idx; served, the exact state at event `at` (the
     * event under the click, which a zoomed-out point only stands near). */
    function show(idx, at) {
      if (idx == null || idx < 0 || idx >= events.length) return;
      var w = why(idx);
      var F = flameAt(idx, w);
      // At the peak the page holds the replay's exact graph (every block,
      // with its stack): show it rather than the largest blocks kept here.
      var exact = idx === tl.peak && D.flame && D.flame.value && D.flame.value[0] === T.allocated[idx];
      if (ML.showFlame) ML.showFlame(exact ? D.flame : F);
      var S = segmentsAt(events[idx]);
      if (S && ML.showSegments) ML.showSegments(S);
      ML.momentIndex = idx;
      ML.charts.timeline.redraw(false);
      status.textContent = 'Shown below: event ' + ML.fmtInt(events[idx]) + (w ? ' (' + w + ')' : '') + ', ' + fb(T.allocated[idx]) + ' allocated; ' +
        (exact ? 'every block by its stack, as the replay left them.' :
          fb(F.kept) + ' in the ' + ML.fmtInt(allocs.length) + ' largest of ' + ML.fmtInt(M.total_allocs) + ' allocations, kept one by one' +
          (F.rest ? ', ' + fb(F.rest) + ' in smaller ones' : '') + '.');
      ML.moment = { index: idx, event: events[idx], flame: exact ? D.flame.title : F.title, segments: S ? S.when : null, segmentEvent: S ? S.event : null, exact: !!exact };
      if (D.state_url) askExact(idx, w, at != null ? at : events[idx]);
    }
    /* Served by `memlens report --serve`: memlens replays the trace to the
     * event and answers its whole state (every block with its stack, the
     * segments then), which replaces the approximation drawn meanwhile. */
    var asked = 0;
    function askExact(idx, w, e) {
      var ticket = ++asked;
      ML.moment.pending = true;
      status.textContent += ' Asking memlens for the exact state…';
      fetch(D.state_url + '?event=' + e).then(function (r) {
        if (!r.ok) throw new Error('HTTP ' + r.status);
        return r.json();
      }).then(function (A) {
        if (ticket !== asked) return;
        var st = A.state, F = A.flame;
        if (w) F.title += ' (' + w + ')';
        if (ML.showFlame) ML.showFlame(F);
        if (ML.showSegments) ML.showSegments(A.segments);
        var ev = st.event, what = ev.action.replace('_', ' ') + (ev.action.indexOf('segment') === 0 || ev.action.indexOf('alloc') === 0 || ev.action.indexOf('free') === 0 ? ' of ' + fb(ev.size) : '') + (ev.site ? ' at ' + ML.siteLabel(ev.site) : '');
        status.textContent = 'Shown below: event ' + ML.fmtInt(st.event_index) + (w ? ' (' + w + ')' : '') + ' (' + what + '), ' + fb(st.allocated_bytes) + ' allocated, ' +
          fb(st.reserved_bytes) + ' reserved after it; every block by its stack and the segments, as memlens replayed them. ← → step one event (Shift: 100).';
        ML.moment = { index: idx, event: st.event_index, flame: F.title, segments: A.segments.when, segmentEvent: st.event_index, exact: true, served: true,
          allocated: st.allocated_bytes, reserved: st.reserved_bytes, flameBytes: F.value[0], live: st.live.map(function (l) { return [l.site, l.category, l.bytes]; }) };
        // The marker moves to the event itself.
        ML.charts.timeline.redraw(false);
      }).catch(function (err) {
        if (ticket !== asked) return;
        status.textContent = status.textContent.replace(' Asking memlens for the exact state…', '') + ' (memlens did not answer: ' + err.message + '; the largest allocations are shown.)';
        ML.moment.pending = false;
        ML.moment.servedError = err.message;
      });
    }
    ML.showMoment = show;

    /* Served: the arrow keys step event by event from the one shown, each
     * state replayed by memlens (memory_viz's stepping). */
    var lastEvent = events[events.length - 1];
    function pointAtOrBefore(e) {
      var lo = 0, hi = events.length - 1;
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (events[mid] <= e) lo = mid; else hi = mid - 1; }
      return lo;
    }
    /* Offline, with every allocation kept: the state at event e from the
     * page alone (every live block by its stack; the segment map is the
     * nearest saved one). */
    function showEvent(e) {
      var idx = pointAtOrBefore(e), allocated = keptBytesAt(e);
      var F = flameAtEvent(e, allocated, '');
      if (ML.showFlame) ML.showFlame(F);
      var S = segmentsAt(e);
      if (S && ML.showSegments) ML.showSegments(S);
      ML.momentIndex = idx;
      ML.moment = { index: idx, event: e, flame: F.title, segments: S ? S.when : null, segmentEvent: S ? S.event : null, exact: true, stepped: true, allocated: allocated };
      ML.charts.timeline.redraw(false);
      status.textContent = 'Shown below: event ' + ML.fmtInt(e) + ', ' + fb(allocated) + ' allocated after it; every block by its stack (the page keeps every allocation of this trace)' +
        (S ? '; the segment map ' + S.when : '') + '. ← → step one event (Shift: 100).';
    }
    if (D.state_url || allKept) {
      document.addEventListener('keydown', function (ev) {
        if (ev.key !== 'ArrowRight' && ev.key !== 'ArrowLeft') return;
        var t = ev.target && ev.target.tagName;
        if (t === 'INPUT' || t === 'TEXTAREA' || t === 'SELECT' || !ML.moment) return;
        ev.preventDefault();
        var e = Math.max(0, Math.min(lastEvent, ML.moment.event + (ev.key === 'ArrowRight' ? 1 : -1) * (ev.shiftKey ? 100 : 1)));
        if (!D.state_url) { showEvent(e); return; }
        var idx = pointAtOrBefore(e);
        ML.momentIndex = idx;
        ML.charts.timeline.redraw(false);
        ML.moment = { index: idx, event: e, pending: true };
        status.textContent = '';
        askExact(idx, '', e);
      });
    }

    /* Served: zoomed in, the exact allocated and reserved bytes of the
     * stretch shown, asked of memlens (every event once few enough), drawn
     * over the page's own points, which keep only each run's lows and highs. */
    var zoomTicket = 0, zoomTimer = null, SHAPES_MAX_EVENTS = 4000;
    /* A stretch from the page alone, as memlens serves one (allocations in
     * its form: [alloc, free, size, requested, address, site, stack]); the
     * page does not carry requests, so no rounding is drawn. */
    function localStretch(from, to) {
      var m = to - from + 1, delta = new Float64Array(m + 1), list = [], stackIds = {}, stackLabels = [];
      allocs.forEach(function (a) {
        var s0 = a[0] < 0 ? -1 : a[0], e0 = a[1] < 0 ? Infinity : a[1];
        if (e0 <= from || s0 > to) return;
        var p0 = Math.max(0, s0 - from), p1 = Math.min(m, e0 - from);
        delta[p0] += a[2]; delta[p1] -= a[2];
        var st = -1;
        if (a[4] >= 0 && stacks[a[4]]) {
          if (!(a[4] in stackIds)) { stackIds[a[4]] = stackLabels.length; stackLabels.push(stacks[a[4]].map(function (f) { return frames[f] || '?'; })); }
          st = stackIds[a[4]];
        }
        list.push([s0 < from ? -1 : s0, e0 > to ? -1 : e0, a[2], a[2], a[3], a[5], st]);
      });
      var ev = [], al = [], run = 0;
      for (var k = 0; k < m; k++) { run += delta[k]; ev.push(from + k); al.push(run); }
      return { event: ev, allocated: al, source_points: m, local: true, allocations: { allocs: list, sites: sites, stacks: stackLabels } };
    }
    ML.detail = null;
    ML.onZoom = !D.stretch_url && !allKept ? null : function (u, time) {
      var min = u.scales.x.min, max = u.scales.x.max;
      clearTimeout(zoomTimer);
      var full = min <= events[0] && max >= lastEvent;
      if (time || full || min == null) { ML.detail = null; return; }
      var from = Math.max(0, Math.floor(min)), to = Math.min(lastEvent, Math.ceil(max));
      if (!D.stretch_url) {
        ML.detail = to - from < SHAPES_MAX_EVENTS ? { from: from, to: to, data: localStretch(from, to) } : null;
        return;
      }
      // The page's own points already hold every event of the stretch.
      if (pointAtOrBefore(to) - pointAtOrBefore(from) >= to - from) { ML.detail = null; return; }
      var ticket = ++zoomTicket;
      zoomTimer = setTimeout(function () {
        fetch(D.stretch_url + '?from=' + from + '&to=' + to).then(function (r) {
          if (!r.ok) throw new Error('HTTP ' + r.status);
          return r.json();
        }).then(function (S) {
          if (ticket !== zoomTicket) return;
          ML.detail = { from: from, to: to, data: S };
          u.redraw(false);
        }).catch(function (err) { if (ticket === zoomTicket) ML.detail = { from: from, to: to, error: err.message }; });
      }, 120);
    };
    /* The stretch's allocations stacked as memory_viz stacks them: in the
     * order they were made, each dropping when one below it is freed. For
     * each allocation, [event position, bottom] wherever its bottom moves. */
    function layoutShapes(S) {
      var A = S.allocations, m = S.event.length, first = S.event[0], keys = [];
      for (var pos = 0; pos < m; pos++) keys.push(pos);
      // By position in the stretch: from before it, or to after it, at its ends.
      var L = ML.stackIntervals(A.allocs.map(function (a) { return [a[0] < 0 ? 0 : a[0] - first, a[1] < 0 ? m : a[1] - first, a[2]]; }), keys);
      var bad = 0;
      L.totals.forEach(function (t, p) { if (t !== S.allocated[p]) bad++; });
      return { bottoms: L.bottoms, mismatched: bad, drawn: A.allocs.length };
    }
    /* The allocation at position pos whose stacked bytes hold `bytes`. */
    function shapeUnder(S, L, pos, bytes) {
      var A = S.allocations, first = S.event[0];
      for (var j = 0; j < A.allocs.length; j++) {
        var a = A.allocs[j], s = a[0] < 0 ? 0 : a[0] - first, e = a[1] < 0 ? S.event.length : a[1] - first;
        if (pos < s || pos >= e) continue;
        var bottom = ML.bottomAt(L.bottoms[j], pos);
        if (bytes >= bottom && bytes < bottom + a[2]) return j;
      }
      return -1;
    }
    function bandColor(site) {
      var ls = ML.timeline.layers || [];
      var other = '#8c96a0';
      for (var k = 0; k < ls.length; k++) {
        if (ls[k].label === site) return ls[k].color;
        if (ls[k].label === 'other sites') other = ls[k].color;
      }
      return other;
    }
    function drawShapes(u, S) {
      var A = S.allocations, L = ML.detail.layout || (ML.detail.layout = layoutShapes(S));
      var ctx = u.ctx, m = S.event.length, first = S.event[0];
      // Bytes held after event e are drawn from e to e + 1, as the lines step.
      var X = function (p) { return u.valToPos(first + Math.min(p, m), 'x', true); };
      var Y = function (v) { return u.valToPos(v, 'y', true); };
      var edge = ML.theme === 'dark' ? '#0d1117' : '#ffffff';
      A.allocs.forEach(function (a, j) {
        var s = a[0] < 0 ? 0 : a[0] - first, e = a[1] < 0 ? m : a[1] - first, bl = L.bottoms[j];
        if (!bl.length || e <= s || !ML.traceStacked(ctx, X, Y, bl, s, e, a[2])) return;
        ctx.fillStyle = bandColor(A.sites[a[5]]);
        ctx.globalAlpha = j % 2 ? 0.8 : 1;
        ctx.fill();
        ctx.globalAlpha = 1;
        // An edge only where the shape is tall enough to show it: a thin one
        // would be all edge.
        if (Y(0) - Y(a[2]) >= 3 * devicePixelRatio) {
          ctx.strokeStyle = edge; ctx.lineWidth = 0.5 * devicePixelRatio; ctx.setLineDash([]);
          ctx.stroke();
        }
        // Rounding waste: the block's bytes over the request, hatched light.
        if (a[2] > a[3]) {
          ctx.fillStyle = 'rgba(255,255,255,.55)';
          for (var w = 0; w < bl.length; w++) {
            var q0 = Math.max(s, bl[w][0]), q1 = w + 1 < bl.length ? bl[w + 1][0] : e;
            var y0 = Y(bl[w][1] + a[2]), y1 = Y(bl[w][1] + a[3]);
            if (y1 - y0 >= 1) ctx.fillRect(X(q0), y0, X(q1) - X(q0), y1 - y0);
          }
        }
      });
      ML.shapes = { drawn: L.drawn, mismatched: L.mismatched };
    }
    ML.shapeAt = function (u) {
      var S = ML.detail && ML.detail.data;
      if (!S || !S.allocations || u.cursor.left == null || u.cursor.left < 0) return null;
      var L = ML.detail.layout || (ML.detail.layout = layoutShapes(S));
      var pos = Math.floor(u.posToVal(u.cursor.left, 'x')) - S.event[0];
      if (pos < 0 || pos >= S.event.length) return null;
      var j = shapeUnder(S, L, pos, u.posToVal(u.cursor.top, 'y'));
      if (j < 0) return null;
      var a = S.allocations.allocs[j], el = ML.el;
      var box = el('div', { id: 'shape-panel' });
      box.appendChild(el('h3', { text: 'event ' + ML.fmtInt(S.event[pos]) + ' · one allocation' }));
      var t = el('table');
      function row(k, v) { t.appendChild(el('tr', null, [el('td', { text: k }), el('td', { class: 'num', text: v })])); }
      row('size', fb(a[2]));
      if (a[2] > a[3]) row('requested', fb(a[3]) + ' (+' + fb(a[2] - a[3]) + ' rounding)');
      row('address', '0x' + a[4].toString(16));
      row('allocated at', a[0] < 0 ? 'before event ' + ML.fmtInt(S.event[0]) : 'event ' + ML.fmtInt(a[0]));
      row('freed at', a[1] < 0 ? 'after event ' + ML.fmtInt(S.event[S.event.length - 1]) : 'event ' + ML.fmtInt(a[1]));
      box.appendChild(t);
      var site = S.allocations.sites[a[5]];
      box.appendChild(el('h3', { text: ML.siteLabel(site), style: 'margin-top:8px' }));
      var st = a[6] >= 0 ? S.allocations.stacks[a[6]] : null;
      if (st && st.length) box.appendChild(ML.stackBlock(st));
      ML.hovered = { address: a[4], size: a[2], requested: a[3], alloc: a[0], free: a[1], site: site, event: S.event[pos] };
      return box;
    };
    ML.drawDetail = function (u) {
      var S = ML.detail && ML.detail.data;
      if (!S || !S.event.length) return;
      var ctx = u.ctx, b = u.bbox;
      ctx.save();
      ctx.beginPath(); ctx.rect(b.left, b.top, b.width, b.height); ctx.clip();
      if (S.allocations) {
        // The page's own bands join its sparse points by straight lines,
        // which cross where the exact stretch does not go: the shapes
        // replace them.
        ctx.fillStyle = getComputedStyle(document.getElementById('timeline')).backgroundColor || '#fff';
        ctx.fillRect(b.left, b.top, b.width, b.height);
        drawShapes(u, S);
      }
      [[S.allocated, '#e8590c', []], [S.reserved, '#c62828', [6, 4]]].forEach(function (L) {
        if (!L[0] || L[0].length !== S.event.length) return;
        ctx.strokeStyle = L[1]; ctx.lineWidth = 1.5 * devicePixelRatio; ctx.setLineDash(L[2]);
        ctx.beginPath();
        for (var i = 0; i < S.event.length; i++) {
          var x = u.valToPos(S.event[i], 'x', true), y = u.valToPos(L[0][i], 'y', true);
          // A step: the bytes hold from one event to the next.
          if (i === 0) ctx.moveTo(x, y); else { ctx.lineTo(x, u.valToPos(L[0][i - 1], 'y', true)); ctx.lineTo(x, y); }
        }
        ctx.stroke();
      });
      var label = S.local ? 'each allocation a shape, orange: allocated (' + ML.fmtInt(S.source_points) + ' events; the page keeps every allocation of this trace)' :
        (S.allocations ? 'each allocation a shape (rounding light), ' : '') + 'orange: allocated, exact from memlens (' + ML.fmtInt(S.source_points) + ' events' + (S.event.length < S.source_points ? ', lows and highs of ' + ML.fmtInt(S.event.length) + ' runs)' : ', every one)');
      ctx.font = Math.round(11 * devicePixelRatio) + 'px system-ui, sans-serif';
      ctx.textAlign = 'left'; ctx.textBaseline = 'alphabetic';
      var tw = ctx.measureText(label).width, lh = 15 * devicePixelRatio, ly = b.top + b.height - lh - 4;
      ctx.fillStyle = ML.theme === 'dark' ? 'rgba(13,17,23,.85)' : 'rgba(255,255,255,.85)';
      ctx.fillRect(b.left + 4, ly, tw + 6, lh);
      ctx.fillStyle = '#e8590c';
      ctx.fillText(label, b.left + 7, ly + 11 * devicePixelRatio);
      ctx.restore();
    };

    // The bar: where the moment is chosen, and what is shown.
    var bar = el('div', { class: 'toolbar moment-bar', id: 'moment-bar' });
    var status = el('span', { class: 'muted small', id: 'moment-status', text: 'Click the chart to show that moment in the flame graph and the segment map.' });
    if (tl.peak != null) {
      var bp = el('button', { type: 'button', id: 'moment-peak', text: 'Show the peak' });
      bp.addEventListener('click', function () { show(tl.peak); });
      bar.appendChild(bp);
    }
    if (tl.ooms && tl.ooms.length) {
      var bo = el('button', { type: 'button', id: 'moment-oom', text: 'Show the OOM' });
      bo.addEventListener('click', function () { show(tl.ooms[tl.ooms.length - 1]); });
      bar.appendChild(bo);
    }
    bar.appendChild(status);
    var chart = document.getElementById('timeline-chart');
    var grid = chart.parentNode;
    grid.parentNode.insertBefore(bar, grid.nextSibling);

    // A click (not a drag, which zooms) picks the point under the cursor.
    var down = null;
    chart.addEventListener('mousedown', function (ev) { down = [ev.clientX, ev.clientY]; }, true);
    // In the capture phase: uPlot stops a click it takes for the end of a
    // drag (at the plot's right edge, a click whose pixel it rounds apart
    // from the press), and the last event sits on that edge.
    chart.addEventListener('click', function (ev) {
      if (!down || Math.abs(ev.clientX - down[0]) > 3 || Math.abs(ev.clientY - down[1]) > 3) return;
      var u = ML.charts.timeline;
      if (!u) return;
      // Where the click is, from the click itself: uPlot moves its cursor on
      // the next animation frame, so a click right after a move would read
      // the last position.
      var left = ev.clientX - u.over.getBoundingClientRect().left;
      if (left < 0 || left > u.over.clientWidth) return;
      // A click on (or within 4 px of) the peak's or an OOM's line picks that
      // event: a pixel may hold several points, and these are the ones asked for.
      var xs = tl.xs(), idx = u.posToIdx(left), best = 5, snapped = false;
      [tl.peak].concat(tl.ooms || []).forEach(function (i) {
        if (i == null) return;
        var d = Math.abs(u.valToPos(xs[i], 'x') - left);
        if (d < best) { best = d; idx = i; snapped = true; }
      });
      // Served (or every allocation kept) and drawn by event: the event
      // under the click, exact.
      var at = null;
      if ((D.state_url || allKept) && !snapped && xs[0] === events[0] && xs[xs.length - 1] === lastEvent) {
        at = Math.max(0, Math.min(lastEvent, Math.floor(u.posToVal(left, 'x'))));
        idx = pointAtOrBefore(at);
      }
      if (!D.state_url && at != null) showEvent(at);
      else show(idx, at);
    }, true);

    // A run that ended in an OOM opens on the OOM: that is the moment to explain.
    if (tl.ooms && tl.ooms.length) show(tl.ooms[tl.ooms.length - 1]);

    // "other sites" opened: the largest kept sites outside the bands at event e.
    ML.otherSitesAt = function (e, bandSites) {
      var inBand = {};
      (bandSites || []).forEach(function (s) { inBand[s.site] = 1; });
      var by = {};
      liveAt(e).forEach(function (a) {
        var s = sites[a[5]] || '?';
        if (!inBand[s]) by[s] = (by[s] || 0) + a[2];
      });
      var list = Object.keys(by).sort(function (a, b) { return by[b] - by[a]; });
      var box = el('div', { class: 'small' }, [el('h3', { text: 'In “other sites” at this event', style: 'margin-top:8px' })]);
      if (!list.length) { box.appendChild(el('p', { class: 'muted', text: 'Only allocations too small to be kept one by one.' })); return box; }
      var t = el('table');
      list.slice(0, 10).forEach(function (s) {
        t.appendChild(el('tr', null, [el('td', null, [el('span', { class: 'site', text: ML.siteLabel(s), title: s })]), el('td', { class: 'num', text: fb(by[s]) })]));
      });
      box.appendChild(t);
      if (list.length > 10) box.appendChild(el('p', { class: 'muted', text: (list.length - 10) + ' more sites; allocations under ' + fb(M.min_kept_bytes) + ' are not listed.' }));
      return box;
    };
  }]);
})();
