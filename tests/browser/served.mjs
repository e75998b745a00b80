// Opens a report served by `memlens report --serve` in headless Chromium,
// clicks the timeline at a few places (not the peak nor an OOM, which the page
// carries already), steps with the arrow keys, zooms in by dragging until
// memlens sends every event of the stretch, clicks there, and writes what the
// page showed (issue 33: "the state at a clicked event equals `memlens state`
// replayed to that event"): for each clicked or stepped event, the allocated
// and reserved bytes memlens answered, the flame graph's total and its live
// sites; for three events of the zoomed stretch, its figures. Fails on any
// console error, any request outside the served origin, or a click the page
// did not answer with the exact state at that event.
//
// usage: node served.mjs URL OUT.json [FRACTIONS]   (FRACTIONS: 0.3,0.55,0.8)
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [url, outJson, fractionsArg] = process.argv.slice(2);
if (!url || !outJson) {
  console.error('usage: node served.mjs URL OUT.json [FRACTIONS]');
  process.exit(2);
}
const fractions = (fractionsArg || '0.3,0.55,0.8').split(',').map(Number);
const origin = new URL(url).origin;
const failures = [];
const fail = (msg) => failures.push(msg);
const profile = mkdtempSync(join(tmpdir(), 'memlens-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const clicks = [];
const zoomed = [];
const hoveredShape = [];
try {
  const page = context.pages()[0] || await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error') fail(`console error: ${m.text()}`); });
  page.on('pageerror', (e) => fail(`page error: ${e.message}`));
  await page.route('**/*', (route) => {
    const u = route.request().url();
    if (u.startsWith(origin + '/') || u.startsWith('data:') || u.startsWith('blob:')) return route.continue();
    fail(`network request outside memlens: ${u}`);
    return route.abort();
  });
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForFunction(() => window.memlens && window.memlens.ready === true, null, { timeout: 30000 });
  if (!(await page.evaluate(() => !!window.memlens.data.state_url))) fail('the served page does not know where to ask for states');
  const read = () => page.evaluate(() => {
    const ML = window.memlens, m = ML.moment;
    return { index: m.index, event: m.event, timelineEvent: ML.timeline.events[m.index], timelineAllocated: ML.data.timeline.allocated[m.index],
      allocated: m.allocated, reserved: m.reserved, flameBytes: m.flameBytes, live: m.live, flame: ML.flame && ML.flame.title,
      segments: ML.segments && ML.segments.when, status: document.getElementById('moment-status').textContent, error: m.servedError || null };
  });
  // The answer replays up to the event: a second or so on a 1 GB trace.
  const answered = (want) => page.waitForFunction((e) => { const m = window.memlens.moment; return m && (m.servedError || (m.served && (e == null || m.event === e))); }, want, { timeout: 60000 });
  const checkShown = (got, what) => {
    if (got.error) { fail(`${what}: memlens did not answer: ${got.error}`); return false; }
    const evText = Number(got.event).toLocaleString('en-US');
    if (!String(got.flame).includes('event ' + evText)) fail(`${what}: the flame graph is not at event ${evText}: ${got.flame}`);
    if (!String(got.segments).includes('event ' + evText)) fail(`${what}: the segment map is not at event ${evText}: ${got.segments}`);
    if (got.flameBytes !== got.allocated) fail(`${what}: the flame graph holds ${got.flameBytes} B of ${got.allocated} B allocated`);
    // Where the clicked event is one of the page's own points, its figure there agrees.
    if (got.timelineEvent === got.event && got.timelineAllocated !== got.allocated) fail(`${what}: the timeline says ${got.timelineAllocated} B allocated at event ${got.event}, the replay ${got.allocated} B`);
    clicks.push({ what, ...got });
    return true;
  };
  const plot = () => page.evaluate(() => {
    document.getElementById('timeline-chart').scrollIntoView({ block: 'center', behavior: 'instant' });
    const r = window.memlens.charts.timeline.over.getBoundingClientRect();
    return { left: r.left, top: r.top, width: r.width, height: r.height };
  });
  const clickAt = async (frac) => {
    const r = await plot();
    const x = r.left + Math.round(r.width * frac), y = r.top + r.height * 0.6;
    await page.mouse.move(x, y, { steps: 3 });
    await page.waitForTimeout(50);
    await page.mouse.click(x, y);
    await answered(null);
    return read();
  };
  // Clicks: the state at the event under each (not a point the page holds).
  for (const f of fractions) checkShown(await clickAt(f), `click at ${f}`);
  // The arrow keys step one event (Shift: 100), each state replayed.
  const before = clicks.length ? clicks[clicks.length - 1].event : null;
  for (const [key, step] of [['ArrowRight', 1], ['ArrowRight', 1], ['Shift+ArrowLeft', -100]]) {
    const from = (await read()).event;
    await page.keyboard.press(key);
    await answered(from + step);
    checkShown(await read(), `${key} from event ${from}`);
  }
  if (before != null && clicks[clicks.length - 1].event !== before + 2 - 100) fail(`the arrow keys did not step from event ${before} to ${before - 98}`);
  // Zoom in by dragging (a tenth of the width each time) until memlens
  // answers every event of the stretch shown, then click there.
  let detail = null;
  for (let k = 0; k < 8; k++) {
    const r = await plot();
    const x0 = r.left + r.width * 0.45, x1 = r.left + r.width * 0.55, y = r.top + r.height * 0.5;
    await page.mouse.move(x0, y, { steps: 2 });
    await page.mouse.down();
    await page.mouse.move(x1, y, { steps: 5 });
    await page.mouse.up();
    await page.waitForTimeout(200);
    // The stretch of the range now shown (the last one stays drawn until it comes).
    detail = await page.waitForFunction(() => {
      const ML = window.memlens, d = ML.detail, x = ML.charts.timeline.scales.x;
      return d && (d.data || d.error) && d.from === Math.max(0, Math.floor(x.min)) ? d : null;
    }, null, { timeout: 30000 }).then((h) => h.jsonValue()).catch(() => null);
    if (!detail) { fail(`zoom ${k + 1}: memlens sent no stretch`); break; }
    if (detail.error) { fail(`zoom ${k + 1}: ${detail.error}`); break; }
    if (detail.data.event.length === detail.data.source_points) break;
  }
  if (detail && detail.data) {
    const S = detail.data;
    if (S.event.length !== S.source_points) fail(`zoomed in 8 times, the stretch has ${S.event.length} of ${S.source_points} events`);
    for (let i = 1; i < S.event.length; i++) if (S.event[i] !== S.event[i - 1] + 1) { fail(`the zoomed stretch skips from event ${S.event[i - 1]} to ${S.event[i]}`); break; }
    zoomed.push(...[0, S.event.length >> 1, S.event.length - 1].map((i) => ({ event: S.event[i], allocated: S.allocated[i], reserved: S.reserved[i] })));
    // Every allocation of the stretch a shape, stacked to the allocated bytes
    // at every event; the one under the cursor named in the panel.
    const shapes = await page.evaluate(() => window.memlens.shapes || null);
    if (!S.allocations) fail('zoomed to single events, memlens listed no allocations');
    else if (!shapes || shapes.drawn !== S.allocations.allocs.length) fail(`shapes drawn: ${JSON.stringify(shapes)} of ${S.allocations.allocs.length} allocations`);
    else if (shapes.mismatched) fail(`the shapes do not add up to the allocated bytes at ${shapes.mismatched} events`);
    const r = await plot();
    await page.mouse.move(r.left + r.width * 0.5, r.top + r.height * 0.9, { steps: 3 });
    await page.waitForTimeout(100);
    const hovered = await page.evaluate(() => ({ h: window.memlens.hovered || null, panel: (document.getElementById('shape-panel') || {}).textContent || '' }));
    if (!hovered.h || !hovered.panel.includes('one allocation')) fail(`hovering a shape named no allocation: ${JSON.stringify(hovered)}`);
    else hoveredShape.push(hovered.h);
    checkShown(await clickAt(0.5), `click zoomed into events ${detail.from}-${detail.to}`);
    await (await page.$('#timeline')).screenshot({ path: outJson.replace(/\.json$/, '') + '-zoomed.png' });
  }
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
writeFileSync(outJson, JSON.stringify({ clicks, zoomed, hovered: hoveredShape }, null, 1));
if (clicks.length !== fractions.length + 4) fail(`${clicks.length} of ${fractions.length + 4} clicks and steps answered`);
if (failures.length) {
  for (const f of failures) console.error(`FAIL: ${f}`);
  process.exit(1);
}
console.log(`ok: ${url}: ${clicks.length} clicked or stepped events shown exact (${clicks.map((c) => c.event).join(', ')}); zoomed to ${zoomed.length ? zoomed[0].event + '-' + zoomed[zoomed.length - 1].event : 'nothing'}, every event`);
