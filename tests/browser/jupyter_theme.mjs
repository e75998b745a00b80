// The report shown in a notebook follows the notebook's theme, not the
// system's (issue 33). usage: node jupyter_theme.mjs PAGE.html SYSTEM WANT
// PAGE: a notebook-like page with memlens's iframe (notebook_frame.py);
// SYSTEM: the system's colour scheme (light|dark); WANT: the theme the report
// must draw in. Checks the report's own theme and its page background, and
// that the report drew (window.memlens.ready) with no console error, in
// the one iframe left on the page.
import { chromium } from 'playwright-core';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [pagePath, system, want] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox', '--disable-gpu'] });
const page = await browser.newPage({ viewport: { width: 1280, height: 800 }, colorScheme: system });
const errors = [];
page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
page.on('pageerror', (e) => errors.push(String(e)));
await page.goto(pathToFileURL(resolve(pagePath)).href, { waitUntil: 'load' });
let got = null;
for (let i = 0; i < 100 && !got; i++) {
  for (const f of page.frames()) {
    if (f === page.mainFrame()) continue;
    got = await f.evaluate(() => window.memlens && window.memlens.ready === true
      ? { theme: window.memlens.theme, attr: document.documentElement.getAttribute('data-theme'),
          bg: getComputedStyle(document.body).backgroundColor }
      : null).catch(() => null);
    if (got) break;
  }
  if (!got) await page.waitForTimeout(100);
}
const frames = await page.evaluate(() => document.querySelectorAll('iframe').length);
await browser.close();
const dark = (bg) => { const m = /(\d+), (\d+), (\d+)/.exec(bg || ''); return m ? (+m[1] + +m[2] + +m[3]) / 3 < 100 : null; };
const ok = frames === 1 && got && got.theme === want && got.attr === want && dark(got.bg) === (want === 'dark') && errors.length === 0;
console.log(`${ok ? 'PASS' : 'FAIL'} notebook theme (${pagePath.split('/').pop()}, system ${system}): want ${want}, got ${JSON.stringify(got)}, ${frames} iframe(s)${errors.length ? ' errors: ' + errors.join(' | ') : ''}`);
process.exit(ok ? 0 : 1);
