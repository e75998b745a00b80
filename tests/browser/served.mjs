// Opens a report served by `memlens report --serve` in headless Chromium,
// clicks the timeline at a few places (not the peak nor an OOM, which the page
// carries already) and writes what the page then shows of each clicked event
// (issue 33: "the state at a clicked event equals `memlens state` replayed to
// that event"): the event, the allocated and reserved bytes memlens answered,
// the flame graph's total, its live sites and the timeline's own figure there.
// Fails on any console error, any request outside the served origin, or a
// click the page did not answer with the exact state.
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
  for (const f of fractions) {
    await page.evaluate(() => { document.getElementById('timeline-chart').scrollIntoView({ block: 'center', behavior: 'instant' }); });
    const pos = await page.evaluate((frac) => {
      const u = window.memlens.charts.timeline, r = u.over.getBoundingClientRect();
      return { x: r.left + Math.round(r.width * frac), y: r.top + r.height * 0.6 };
    }, f);
    await page.mouse.move(pos.x, pos.y, { steps: 3 });
    await page.waitForTimeout(50);
    await page.mouse.click(pos.x, pos.y);
    // The answer replays up to the event: seconds on a 1 GB trace.
    await page.waitForFunction(() => { const m = window.memlens.moment; return m && (m.served || m.servedError); }, null, { timeout: 60000 });
    const got = await page.evaluate(() => {
      const ML = window.memlens, m = ML.moment;
      return { index: m.index, event: m.event, timelineEvent: ML.timeline.events[m.index], timelineAllocated: ML.data.timeline.allocated[m.index],
        allocated: m.allocated, reserved: m.reserved, flameBytes: m.flameBytes, live: m.live, flame: ML.flame && ML.flame.title,
        segments: ML.segments && ML.segments.when, status: document.getElementById('moment-status').textContent, error: m.servedError || null };
    });
    if (got.error) { fail(`click at ${f}: memlens did not answer: ${got.error}`); continue; }
    const evText = Number(got.event).toLocaleString('en-US');
    if (got.event !== got.timelineEvent) fail(`click at ${f}: the state is of event ${got.event}, the point clicked is event ${got.timelineEvent}`);
    if (!String(got.flame).includes('event ' + evText)) fail(`click at ${f}: the flame graph is not at event ${evText}: ${got.flame}`);
    if (!String(got.segments).includes('event ' + evText)) fail(`click at ${f}: the segment map is not at event ${evText}: ${got.segments}`);
    if (got.flameBytes !== got.allocated) fail(`click at ${f}: the flame graph holds ${got.flameBytes} B of ${got.allocated} B allocated`);
    if (got.timelineAllocated !== got.allocated) fail(`click at ${f}: the timeline says ${got.timelineAllocated} B allocated at event ${got.event}, the replay ${got.allocated} B`);
    clicks.push(got);
  }
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
writeFileSync(outJson, JSON.stringify(clicks, null, 1));
if (clicks.length !== fractions.length) fail(`${clicks.length} of ${fractions.length} clicks answered`);
if (failures.length) {
  for (const f of failures) console.error(`FAIL: ${f}`);
  process.exit(1);
}
console.log(`ok: ${url}: ${clicks.length} clicked events shown exact (${clicks.map((c) => c.event).join(', ')})`);
