// Opens a memlens HTML report in headless Chromium and checks it (issue 7's
// acceptance): no console or page error, no network request, every section
// whose data is present drew, and the flame graph holds the expected site.
// Saves a full-page screenshot.
//
// Issue 18's points too, on every report: no zero-byte legend entry; a click
// on the timeline at the peak and at each OOM redraws the flame graph and the
// segment map at that event; the OOM section draws the request against the
// largest free piece; no horizontal overflow at 800 px; the same checks in the
// dark theme, with a second screenshot (OUT-dark.png).
//
// usage: node check.mjs REPORT.html EXPECTED_SITE OUT.png
// env:   CHROMIUM (default /usr/bin/chromium)
//        MEMLENS_EXPECT  comma list of what the report must show: leak, oom,
//                        overview (a per-snapshot table), moments, ranks
//                        (a row with the exact peak and a chart per rank)
//        MEMLENS_MAX_LOAD_MS  fail when the page takes longer to be ready
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync, existsSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [report, expectedSite, outPng] = process.argv.slice(2);
if (!report || !expectedSite || !outPng) {
  console.error('usage: node check.mjs REPORT.html EXPECTED_SITE OUT.png');
  process.exit(2);
}
if (!existsSync(report)) {
  console.error(`check: ${report}: no such file`);
  process.exit(2);
}

// A frame of C, C++ or CPython itself (stacks="all"), as a flame label:
// "??:0 in fn", ":0 in fn", "X.cpp:0 in fn". The report leaves them out.
const NATIVE_FRAME = /^(\?\?)?:0 in |\.(c|cc|cpp|h|cu):\d+ in /;
const failures = [];
const fail = (msg) => failures.push(msg);
const profile = mkdtempSync(join(tmpdir(), 'memlens-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 900 },
  deviceScaleFactor: 1,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let summary = {};
try {
  const page = context.pages()[0] || await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error') fail(`console error: ${m.text()}`); });
  page.on('pageerror', (e) => fail(`page error: ${e.message}`));
  // The report must work offline: any request other than the file itself fails the test.
  const url = pathToFileURL(resolve(report)).href;
  await page.route('**/*', (route) => {
    const u = route.request().url();
    if (u === url || u.startsWith('data:') || u.startsWith('blob:')) return route.continue();
    fail(`network request: ${u}`);
    return route.abort();
  });

  const t0 = Date.now();
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForFunction(() => window.memlens && window.memlens.ready === true, null, { timeout: 15000 });
  const loadMs = Date.now() - t0;

  const state = await page.evaluate(([site, nativeRe]) => {
    const NATIVE_FRAME = new RegExp(nativeRe);
    const ML = window.memlens, D = ML.data;
    const visible = (id) => { const e = document.getElementById(id); return !!e && !e.hidden && e.offsetHeight > 0; };
    const out = { sections: {}, present: {} };
    for (const id of ['timeline', 'flame', 'segments', 'leaks', 'tune']) {
      out.present[id] = D[id] != null;
      out.sections[id] = visible(id);
    }
    out.findings = document.querySelectorAll('#findings-list .finding').length;
    out.expectedFindings = (D.findings || []).length;
    if (D.timeline) {
      const u = ML.charts.timeline;
      out.timeline = {
        canvas: !!document.querySelector('#timeline-chart canvas'),
        points: u ? u.data[0].length : 0,
        series: u ? u.series.length - 1 : 0,
        dataPoints: D.timeline.x.length,
      };
    }
    if (D.flame) {
      const c = document.getElementById('flame-canvas');
      let inked = 0;
      if (c && c.width && c.height) {
        const px = c.getContext('2d').getImageData(0, 0, c.width, Math.min(c.height, 200)).data;
        for (let i = 3; i < px.length; i += 4 * 7) if (px[i] > 0) inked++;
      }
      out.flame = {
        nodes: ML.flame ? ML.flame.nodes : 0,
        drawn: ML.flame ? ML.flame.drawn : 0,
        inked,
        hasSite: !!ML.flame && ML.flame.names.some((n) => n.includes(site)),
        native: ML.flame ? ML.flame.names.filter((n) => NATIVE_FRAME.test(n)).slice(0, 5) : [],
      };
    }
    if (D.segments) {
      const om = D.segments.omitted || {};
      const head = (document.getElementById('segments-sub').textContent.match(/([\d,]+) segments/) || [])[1];
      // The map shown: the page's own, or the one saved at the moment it
      // opened on (a run that ended in an OOM opens on the OOM).
      const shown = ML.segments || { rows: D.segments.segments.length, all: D.segments.segments.length + (om.count || 0) };
      out.segments = { rows: document.querySelectorAll('#segments-rows .seg-row').length, expected: shown.rows,
        counted: head ? Number(head.replace(/,/g, '')) : null, all: shown.all, when: D.segments.when };
    }
    if (D.leaks) out.leaks = { charts: (ML.charts.leaks || []).length, expected: D.leaks.sites.length };
    if (D.tune) out.tune = { rows: document.querySelectorAll('#tune-table tbody tr').length, expected: D.tune.rows.length };
    return out;
  }, [expectedSite, NATIVE_FRAME.source]);

  for (const [id, present] of Object.entries(state.present)) {
    if (present && !state.sections[id]) fail(`section ${id}: data present but not shown`);
    if (!present && state.sections[id]) fail(`section ${id}: shown without data`);
  }
  if (state.findings !== state.expectedFindings) fail(`findings: ${state.findings} drawn, ${state.expectedFindings} in the data`);
  if (state.timeline) {
    const t = state.timeline;
    if (!t.canvas) fail('timeline: no uPlot canvas');
    if (t.points < 2 || t.points !== t.dataPoints) fail(`timeline: ${t.points} points in uPlot, ${t.dataPoints} in the data`);
  }
  if (state.flame) {
    const f = state.flame;
    if (f.drawn < 1 || f.inked < 1) fail(`flame: nothing drawn (${f.drawn} rects, ${f.inked} inked pixels)`);
    if (!f.hasSite) fail(`flame: no node names ${JSON.stringify(expectedSite)}`);
    if (f.native.length) fail(`flame: native frames drawn: ${JSON.stringify(f.native)}`);
  }
  if (state.segments && (state.segments.rows < 1 || state.segments.rows !== state.segments.expected)) {
    fail(`segments: ${state.segments.rows} rows drawn, ${state.segments.expected} in the data`);
  }
  // The header counts every segment, the ones too small to draw included
  // (issue 33: "96 segments" over a map of 190).
  if (state.segments && state.segments.counted !== state.segments.all) {
    fail(`segments: the header counts ${state.segments.counted} segments, the map holds ${state.segments.all}`);
  }
  // MEMLENS_SEGMENTS: the segments `memlens summary` counts in the file.
  if (process.env.MEMLENS_SEGMENTS && (!state.segments || state.segments.all !== Number(process.env.MEMLENS_SEGMENTS))) {
    fail(`segments: the map holds ${state.segments && state.segments.all}, the file ${process.env.MEMLENS_SEGMENTS}`);
  }
  // A snapshot with no allocations in its trace (PyTorch 2.0's one entry):
  // no chart over time drawn empty, the map and flame graph of the dump.
  if ((process.env.MEMLENS_EXPECT || '').split(',').includes('dump')) {
    if (state.present.timeline) fail('a snapshot without an allocation trace draws a timeline');
    if (!state.segments || state.segments.when !== 'at dump time') fail(`the segment map is not the dump's: ${state.segments && state.segments.when}`);
  }
  if (state.leaks && state.leaks.charts !== state.leaks.expected) fail(`leaks: ${state.leaks.charts} charts, ${state.leaks.expected} sites`);
  if (state.tune && state.tune.rows !== state.tune.expected) fail(`tune: ${state.tune.rows} rows, ${state.tune.expected} in the data`);

  // Library frames (issue 33): folded into one frame per run at load, as
  // the terminal reads stacks; the box shows them all, and unticked folds again.
  if (state.flame) {
    const lib = await page.evaluate(() => ({ runs: window.memlens.flame.libraryRuns(), nodes: window.memlens.flame.nodes }));
    if (lib.runs) fail(`flame: ${lib.runs} library frames drawn under another library frame (not folded)`);
    await page.check('#flame-library');
    const all = await page.evaluate(() => ({ runs: window.memlens.flame.libraryRuns(), nodes: window.memlens.flame.nodes, shown: window.memlens.flame.libraryShown }));
    if (!all.shown || all.nodes < lib.nodes) fail(`flame: the library toggle shows no more frames (${lib.nodes} -> ${all.nodes})`);
    await page.uncheck('#flame-library');
    const again = await page.evaluate(() => window.memlens.flame.nodes);
    if (again !== lib.nodes) fail(`flame: unticking library frames gives ${again} frames, not the ${lib.nodes} at load`);
    state.flame.library = { folded: lib.nodes, all: all.nodes };
  }

  // Interactions: search the flame graph, hover it, zoom the timeline and reset.
  if (state.flame) {
    await page.fill('#flame-search', expectedSite);
    // The search runs after a short pause in typing; wait until it has.
    await page.waitForFunction((q) => window.memlens.flame.query === q, expectedSite.trim().toLowerCase(), { timeout: 10000 })
      .catch(() => fail('flame search never ran'));
    const matches = await page.evaluate(() => window.memlens.flame.matches || 0);
    if (matches < 1) fail(`flame search for ${JSON.stringify(expectedSite)}: no match`);
    state.flame.matches = matches;
    // Bring the top of the graph below the sticky navigation bar, then hover its second row.
    // (Its top, 100 px down: a deep graph is taller than the window, and centring it would put its top above.)
    // Under load an event can land late or the layout move: up to three tries.
    let tipShown = false;
    for (let attempt = 0; attempt < 3 && !tipShown; attempt++) {
      await page.evaluate(() => { const b = document.getElementById('flame-box'); window.scrollTo({ top: b.getBoundingClientRect().top + window.scrollY - 100, behavior: 'instant' }); });
      await page.waitForTimeout(100);
      const box = await page.locator('#flame-canvas').boundingBox();
      await page.mouse.move(box.x + box.width / 3, box.y + 30);
      await page.mouse.move(box.x + box.width / 3 + 2, box.y + 31);
      tipShown = await page.waitForFunction(() => !document.getElementById('tip').hidden, null, { timeout: 2000 })
        .then(() => true, () => false);
    }
    if (!tipShown) fail('flame: hovering shows no tooltip');
    await page.mouse.move(0, 0);
  }
  if (state.timeline) {
    await page.evaluate(() => { document.getElementById('timeline-chart').scrollIntoView({ block: 'center', behavior: 'instant' }); });
    const box = await page.locator('#timeline-chart .u-over').boundingBox();
    const before = await page.evaluate(() => { const s = window.memlens.charts.timeline.scales.x; return [s.min, s.max]; });
    await page.mouse.move(box.x + box.width * 0.3, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.6, box.y + box.height / 2, { steps: 5 });
    await page.mouse.up();
    const after = await page.evaluate(() => { const s = window.memlens.charts.timeline.scales.x; return [s.min, s.max]; });
    if (!(after[1] - after[0] < (before[1] - before[0]) * 0.9)) fail(`timeline: drag did not zoom (${before} -> ${after})`);
    const panel = await page.evaluate(() => document.getElementById('timeline-panel').textContent.length);
    if (panel < 10) fail('timeline: hover panel is empty');
    await page.click('#timeline-reset');
    const reset = await page.evaluate(() => { const s = window.memlens.charts.timeline.scales.x; return [s.min, s.max]; });
    if (Math.abs(reset[1] - reset[0] - (before[1] - before[0])) > 1e-9 * Math.abs(before[1] - before[0]) + 1e-9) fail(`timeline: reset did not restore (${reset})`);
    await page.mouse.move(0, 0);
    // Leave the cursor on the peak so the screenshot shows the hover panel.
    await page.evaluate(() => window.memlens.timeline.showPeak());
  }
  await page.fill('#flame-search', '').catch(() => {});
  const extra = await issue18(page, 'light');
  await page.evaluate(() => window.scrollTo({ top: 0, behavior: 'instant' }));
  await page.waitForTimeout(200);
  await page.screenshot({ path: outPng, fullPage: true });
  // The dark theme: the same page as the system's dark mode shows it.
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.reload({ waitUntil: 'load' });
  await page.waitForFunction(() => window.memlens && window.memlens.ready === true, null, { timeout: 15000 });
  const dark = await issue18(page, 'dark');
  await page.evaluate(() => window.scrollTo({ top: 0, behavior: 'instant' }));
  await page.waitForTimeout(200);
  await page.screenshot({ path: outPng.replace(/\.png$/, '') + '-dark.png', fullPage: true });
  const maxLoad = Number(process.env.MEMLENS_MAX_LOAD_MS || 0);
  if (maxLoad && loadMs > maxLoad) fail(`load: ${loadMs} ms, over ${maxLoad} ms`);
  summary = { report, bytes: statSync(report).size, load_ms: loadMs, ...state, issue18: extra, dark_theme: dark.theme };
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}

/** Issue 18's checks on the page as it stands (light or dark). */
async function issue18(page, theme) {
  const expect = new Set((process.env.MEMLENS_EXPECT || '').split(',').filter(Boolean));
  const out = await page.evaluate(() => {
    const ML = window.memlens, D = ML.data;
    const r = { theme: ML.theme, present: { oom: D.oom != null, overview: D.overview != null, moments: D.moments != null, leaks: D.leaks != null } };
    r.zeroLegend = (ML.timeline && ML.timeline.layers || []).filter((l) => !(l.max > 0)).map((l) => l.label);
    r.leakCharts = (ML.charts.leaks || []).length;
    r.overviewRows = document.querySelectorAll('#overview-table tbody tr').length;
    r.expectedOverviewRows = D.overview ? D.overview.rows.length : 0;
    r.oom = ML.oom || null;
    // Ranks side by side: one table row and one chart per rank, each rank's
    // exact peak printed in its row.
    r.ranks = D.ranks ? {
      expected: D.ranks.ranks.map((x) => ({ rank: x.rank, peak: x.peak_allocated_bytes })),
      rows: Array.from(document.querySelectorAll('#ranks-table tr')).slice(1).map((tr) => Array.from(tr.cells).map((c) => c.textContent)),
      charts: (ML.charts.ranks || []).length,
      visible: !document.getElementById('ranks').hidden,
      files: D.ranks.ranks.map((x) => x.file.split('/').pop()),
      title: document.getElementById('title').textContent,
      overview: D.overview != null || !document.getElementById('overview').hidden,
      // The heavier rank's row: its text against its background.
      heavy: (() => {
        const td = document.querySelector('#ranks-table tr.heavy td');
        if (!td) return null;
        const cs = getComputedStyle(td);
        let bg = cs.backgroundColor, e = td;
        // A transparent tint shows the card below: blend over it.
        const rgba = (c) => (c.match(/[\d.]+/g) || []).map(Number);
        let [r, g, b, a] = rgba(bg); a = a == null ? 1 : a;
        while (a < 1 && (e = e.parentElement)) {
          const [r2, g2, b2, a2] = rgba(getComputedStyle(e).backgroundColor);
          if (a2 === 0) continue;
          [r, g, b] = [r * a + r2 * (1 - a), g * a + g2 * (1 - a), b * a + b2 * (1 - a)]; a = 1;
        }
        return { fg: rgba(cs.color).slice(0, 3), bg: [r, g, b] };
      })(),
      peakInk: ML.rankPeakInk || null,
    } : null;
    // The verdict in one sentence, the terminal's (a healthy run is told so).
    const v = document.querySelector('#findings-list .verdict');
    r.verdict = { shown: v ? v.textContent : null, data: D.meta && D.meta.verdict };
    r.oomRects = document.querySelectorAll('#oom-bars svg rect').length;
    r.oomFixRows = document.querySelectorAll('#oom-fixes tbody tr').length;
    // Each fix's verdict as drawn, and the terminal's tag for it.
    r.oomVerdicts = Array.from(document.querySelectorAll('#oom-fixes tbody tr')).map((tr) => [tr.cells[0].textContent, tr.cells[tr.cells.length - 1].textContent]);
    r.expectedVerdicts = D.oom ? D.oom.fixes.map((f) => f.verdict) : [];
    r.expectedFixes = D.oom ? D.oom.fixes.length : 0;
    // "other sites" can be opened: at the peak it lists the sites it holds.
    const T = D.timeline, tl = ML.timeline;
    if (T && tl && tl.peak != null && ML.otherSitesAt && T.other && T.other[tl.peak] > 0) {
      r.otherOpened = ML.otherSitesAt(tl.events[tl.peak], T.sites).querySelectorAll('tr').length;
    }
    return r;
  });
  if (out.zeroLegend.length) fail(`${theme}: timeline legend entries that are always 0 B: ${out.zeroLegend.join(', ')}`);
  if (!out.verdict.shown || out.verdict.shown !== out.verdict.data) fail(`${theme}: the verdict sentence is not shown (${JSON.stringify(out.verdict)})`);
  if (expect.has('healthy') && !out.verdict.shown.startsWith('Verdict: no leak, no OOM')) fail(`${theme}: a healthy run is not told so: ${out.verdict.shown}`);
  if (expect.has('leak') && !(out.present.leaks && out.leakCharts > 0)) fail(`${theme}: no leak shown`);
  if (expect.has('overview') && (out.overviewRows < 2 || out.overviewRows !== out.expectedOverviewRows)) fail(`${theme}: overview has ${out.overviewRows} rows, ${out.expectedOverviewRows} snapshots`);
  if (expect.has('oom') && !out.present.oom) fail(`${theme}: no OOM section data`);
  if (out.present.oom) {
    if (!out.oom || out.oom.bars < 2 || out.oomRects < 2) fail(`${theme}: OOM section draws no request against a free piece (${out.oomRects} bars)`);
    if (out.oomFixRows !== out.expectedFixes) fail(`${theme}: OOM fixes: ${out.oomFixRows} rows, ${out.expectedFixes} in the data`);
    // The fix table says what the terminal says, and no row contradicts
    // itself (issue 33: "(simulated)" under "not simulated", "fits" beside
    // "a lower bound").
    out.oomVerdicts.forEach(([action, verdict], i) => {
      if (verdict !== out.expectedVerdicts[i]) fail(`${theme}: OOM fix ${i + 1}: verdict ${JSON.stringify(verdict)}, the terminal's ${JSON.stringify(out.expectedVerdicts[i])}`);
      if (/\(simulated\)/.test(action) && !['fits', 'may fit', 'helps, not enough', 'would not help'].includes(verdict)) fail(`${theme}: OOM fix ${i + 1} is simulated but marked ${JSON.stringify(verdict)}`);
      if (/step fits/.test(action) && verdict !== 'fits') fail(`${theme}: OOM fix ${i + 1} says the step fits but is marked ${JSON.stringify(verdict)}`);
    });
  }
  if (expect.has('moments') && !out.present.moments) fail(`${theme}: no moments data`);
  if (expect.has('ranks')) {
    const R = out.ranks;
    if (!R || !R.visible || R.expected.length < 2) fail(`${theme}: no ranks section with two or more ranks`);
    else {
      if (R.charts !== R.expected.length) fail(`${theme}: ${R.charts} rank charts for ${R.expected.length} ranks`);
      for (const want of R.expected) {
        const row = R.rows.find((cells) => cells[0] === String(want.rank));
        const exact = Number(want.peak).toLocaleString('en-US');
        if (!row || !row.includes(exact)) fail(`${theme}: rank ${want.rank}'s peak ${exact} not in its row: ${JSON.stringify(row)}`);
      }
      // Issue 33: ranks are not one run over time, and the title names the job, no one rank.
      if (R.overview) fail(`${theme}: ranks shown in the "every snapshot" table, as if one run over time`);
      if (R.files.some((f) => R.title.includes(f))) fail(`${theme}: the title names one rank's file: ${R.title}`);
      // Readable in both themes: the heavier rank's row (WCAG contrast 4.5) and the peak labels.
      if (R.heavy) {
        const lum = (c) => { const v = c.map((x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; }); return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
        const [l1, l2] = [lum(R.heavy.fg), lum(R.heavy.bg)].sort((x, y) => y - x);
        const ratio = (l1 + 0.05) / (l2 + 0.05);
        if (ratio < 4.5) fail(`${theme}: the heavier rank's row is unreadable (contrast ${ratio.toFixed(2)}: ${JSON.stringify(R.heavy)})`);
      }
      const ink = theme === 'dark' ? '#e6edf3' : '#1f2328';
      if (R.peakInk !== ink) fail(`${theme}: the ranks' peak labels are drawn in ${R.peakInk}, not the theme's ink ${ink}`);
    }
  }
  if (out.otherOpened === 0) fail(`${theme}: "other sites" holds bytes at the peak but opens to no site`);
  // The timeline filled with the cached segments (memory_viz's segment
  // timeline): they add up to the reserved line at every point, and the one
  // under the cursor is named; then back to the sites.
  out.segmentFill = await page.evaluate(() => {
    const ML = window.memlens;
    if (!ML.setTimelineFill) return null;
    ML.setTimelineFill('segments');
    return ML.segmentFill;
  });
  if (out.segmentFill) {
    if (out.segmentFill.mismatched) fail(`${theme}: the cached segments do not add up to the reserved line at ${out.segmentFill.mismatched} points`);
    const r = await page.evaluate(() => {
      document.getElementById('timeline-chart').scrollIntoView({ block: 'center', behavior: 'instant' });
      const u = window.memlens.charts.timeline, b = u.over.getBoundingClientRect(), T = window.memlens.data.timeline;
      // Halfway up the reserved bytes at the middle point.
      const i = Math.floor(T.reserved.length / 2);
      return { x: b.left + u.valToPos(window.memlens.timeline.xs()[i], 'x'), y: b.top + u.valToPos(T.reserved[i] / 2, 'y'), reserved: T.reserved[i] };
    });
    if (r.reserved > 0) {
      await page.mouse.move(r.x, r.y, { steps: 3 });
      await page.waitForTimeout(100);
      const panel = await page.evaluate(() => (document.getElementById('segment-panel') || {}).textContent || '');
      if (!panel.includes('one cached segment')) fail(`${theme}: hovering the segments fill named no segment`);
    }
    if (process.env.MEMLENS_SEGMENTS_SHOT) await (await page.$('#timeline')).screenshot({ path: `${process.env.MEMLENS_SEGMENTS_SHOT}-${theme}.png` });
    await page.evaluate(() => window.memlens.setTimelineFill('sites'));
  }
  // A trace whose every allocation the page keeps (min_kept_bytes 0) is
  // exact offline at any event: a click between points, the arrow keys one
  // event on, and a zoom to single allocations drawn as shapes, all adding
  // up to the timeline's allocated bytes where it has a point.
  out.offline = await page.evaluate(() => {
    const ML = window.memlens, D = ML.data, M = D.moments;
    if (!M || M.min_kept_bytes || !M.allocs || !M.allocs.length || D.state_url || !ML.timeline || !ML.timeline.events) return null;
    return { events: ML.timeline.events.length, last: ML.timeline.events[ML.timeline.events.length - 1] };
  });
  if (out.offline) {
    const r = await page.evaluate(() => {
      document.getElementById('timeline-chart').scrollIntoView({ block: 'center', behavior: 'instant' });
      const b = window.memlens.charts.timeline.over.getBoundingClientRect();
      return { x: b.left + b.width * 0.37, y: b.top + b.height * 0.6 };
    });
    await page.mouse.move(r.x, r.y, { steps: 3 });
    await page.waitForTimeout(50);
    await page.mouse.click(r.x, r.y);
    const clicked = await page.evaluate(() => window.memlens.moment);
    await page.keyboard.press('ArrowRight');
    const stepped = await page.evaluate(() => window.memlens.moment);
    if (!clicked || !clicked.exact || !stepped || stepped.event !== clicked.event + 1) fail(`${theme}: offline, a click then → did not step one event: ${JSON.stringify([clicked, stepped])}`);
    // uPlot applies a scale (and runs its hooks) on its next commit.
    await page.evaluate((e0) => { window.memlens.charts.timeline.setScale('x', { min: e0, max: e0 + 300 }); }, Math.max(0, stepped.event - 150));
    await page.waitForTimeout(300);
    const zoom = await page.evaluate(() => {
      const ML = window.memlens, T = ML.data.timeline;
      const d = ML.detail && ML.detail.data;
      if (!d || !d.allocations) return { none: true };
      // Where a point of the page falls in the stretch, its allocated bytes.
      let bad = 0, seen = 0;
      ML.timeline.events.forEach((e, i) => { const k = e - d.event[0]; if (k >= 0 && k < d.event.length) { seen++; if (d.allocated[k] !== T.allocated[i]) bad++; } });
      // And where the page steps to an event, the same bytes.
      const at = d.event[150], k = ML.timeline.events.indexOf(at);
      const shapes = ML.shapes || null;
      return { allocs: d.allocations.allocs.length, seen, bad, shapes, k };
    });
    await page.evaluate(() => document.getElementById('timeline-reset').click());
    await page.waitForTimeout(300);
    if (zoom.none) fail(`${theme}: offline, zoomed to 300 events, no allocations drawn`);
    else {
      if (zoom.bad) fail(`${theme}: offline, the zoomed stretch's allocated bytes differ from the timeline's at ${zoom.bad} of ${zoom.seen} points`);
      if (!zoom.shapes || zoom.shapes.mismatched || zoom.shapes.drawn !== zoom.allocs) fail(`${theme}: offline shapes: ${JSON.stringify(zoom)}`);
    }
    out.offline.zoom = zoom;
  }
  // Click the timeline at the peak and at each OOM: the flame graph and the
  // segment map must then show that event.
  out.clicks = [];
  const targets = await page.evaluate(() => {
    const tl = window.memlens.timeline;
    if (!tl || !window.memlens.showMoment) return [];
    const t = [];
    if (tl.peak != null) t.push(['peak', tl.peak]);
    (tl.ooms || []).forEach((i) => t.push(['OOM', i]));
    return t;
  });
  for (const [what, idx] of targets) {
    await page.evaluate(() => { document.getElementById('timeline-chart').scrollIntoView({ block: 'center', behavior: 'instant' }); });
    const pos = await page.evaluate((i) => {
      const u = window.memlens.charts.timeline, xs = window.memlens.timeline.xs();
      const r = u.over.getBoundingClientRect();
      // Inside the plot: the last event sits on its right edge, one pixel out.
      return { x: r.left + Math.min(u.valToPos(xs[i], 'x'), r.width - 1), y: r.top + r.height * 0.6 };
    }, idx);
    // As a hand does: move there, then click (uPlot places its cursor on
    // the next frame; a click that teleports reads as a drag from the old spot).
    await page.mouse.move(pos.x, pos.y, { steps: 3 });
    await page.waitForTimeout(50);
    await page.mouse.click(pos.x, pos.y);
    const got = await page.evaluate((re) => ({ m: window.memlens.moment || null, flame: window.memlens.flame && window.memlens.flame.title, seg: window.memlens.segments && window.memlens.segments.when,
      native: window.memlens.flame ? window.memlens.flame.names.filter((n) => new RegExp(re).test(n)).slice(0, 5) : [] }), NATIVE_FRAME.source);
    if (got.native.length) fail(`${theme}: the flame graph at the ${what} draws native frames: ${JSON.stringify(got.native)}`);
    const runs = await page.evaluate(() => window.memlens.flame.libraryRuns());
    if (runs) fail(`${theme}: the flame graph at the ${what} draws ${runs} library frames unfolded`);
    const ev = await page.evaluate((i) => window.memlens.timeline.events[i], idx);
    const evText = Number(ev).toLocaleString('en-US');
    const ok = got.m && got.m.index === idx && (got.flame || '').includes('event ' + evText) && (got.seg == null || String(got.seg).includes('event'));
    if (!ok) fail(`${theme}: a click on the ${what} (event ${ev}) did not redraw the flame graph and segment map there: ${JSON.stringify(got)}`);
    // At the peak the flame graph is the replay's exact one, every block (issue 33:
    // two thirds of the 1 GB trace's graph was one "...smaller allocations" box).
    if (what === 'peak' && got.m && !got.m.exact) fail(`${theme}: the flame graph at the peak is not the exact one: ${JSON.stringify(got.m)}`);
    if (got.m && got.m.segmentEvent !== ev && (what === 'peak' || what === 'OOM')) fail(`${theme}: the segment map at the ${what} is not the one saved at event ${ev} (${got.m.segmentEvent})`);
    out.clicks.push({ what, event: ev, flame: got.flame, segments: got.seg });
  }
  await page.mouse.move(0, 0);
  // No horizontal overflow at 800 px.
  await page.setViewportSize({ width: 800, height: 900 });
  await page.waitForTimeout(300);
  out.scrollWidth800 = await page.evaluate(() => document.documentElement.scrollWidth);
  if (out.scrollWidth800 > 800) fail(`${theme}: horizontal overflow at 800 px (${out.scrollWidth800} px wide)`);
  if (process.env.MEMLENS_SHOTS_800) await page.screenshot({ path: `${process.env.MEMLENS_SHOTS_800}-${theme}-800.png`, fullPage: false });
  await page.setViewportSize({ width: 1400, height: 900 });
  await page.waitForTimeout(300);
  return out;
}

console.log(JSON.stringify(summary));
if (failures.length) {
  for (const f of failures) console.error(`FAIL: ${f}`);
  process.exit(1);
}
console.log(`ok: ${report} (screenshot ${outPng})`);
