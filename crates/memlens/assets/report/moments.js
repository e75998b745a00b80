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
    function flameAt(idx, why) {
      var e = events[idx], live = liveAt(e);
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
      var rest = (T.allocated[idx] || 0) - kept;
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
    if (D.state_url) {
      document.addEventListener('keydown', function (ev) {
        if (ev.key !== 'ArrowRight' && ev.key !== 'ArrowLeft') return;
        var t = ev.target && ev.target.tagName;
        if (t === 'INPUT' || t === 'TEXTAREA' || t === 'SELECT' || !ML.moment) return;
        ev.preventDefault();
        var e = Math.max(0, Math.min(lastEvent, ML.moment.event + (ev.key === 'ArrowRight' ? 1 : -1) * (ev.shiftKey ? 100 : 1)));
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
    var zoomTicket = 0, zoomTimer = null;
    ML.detail = null;
    ML.onZoom = !D.stretch_url ? null : function (u, time) {
      var min = u.scales.x.min, max = u.scales.x.max;
      clearTimeout(zoomTimer);
      var full = min <= events[0] && max >= lastEvent;
      if (time || full || min == null) { ML.detail = null; return; }
      var from = Math.max(0, Math.floor(min)), to = Math.min(lastEvent, Math.ceil(max));
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
    ML.drawDetail = function (u) {
      var S = ML.detail && ML.detail.data;
      if (!S || !S.event.length) return;
      var ctx = u.ctx, b = u.bbox;
      ctx.save();
      ctx.beginPath(); ctx.rect(b.left, b.top, b.width, b.height); ctx.clip();
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
      var label = 'orange: allocated, exact from memlens (' + ML.fmtInt(S.source_points) + ' events' + (S.event.length < S.source_points ? ', lows and highs of ' + ML.fmtInt(S.event.length) + ' runs)' : ', every one)');
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
      // Served and drawn by event: the event under the click, exact.
      var at = null;
      if (D.state_url && !snapped && xs[0] === events[0] && xs[xs.length - 1] === lastEvent) {
        at = Math.max(0, Math.min(lastEvent, Math.round(u.posToVal(left, 'x'))));
        idx = pointAtOrBefore(at);
      }
      show(idx, at);
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
