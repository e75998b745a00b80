// The README's screenshots: one section of a report, light or dark, one screen.
// usage: node readme_shots.mjs REPORT.html SECTION_ID light|dark OUT.png
import { chromium } from 'playwright-core';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [report, section, theme, out] = process.argv.slice(2);
if (!report || !section || !theme || !out) {
  console.error('usage: node readme_shots.mjs REPORT.html SECTION_ID light|dark OUT.png');
  process.exit(2);
}
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox', '--disable-gpu'] });
const page = await browser.newPage({ viewport: { width: 1280, height: 860 }, colorScheme: theme });
await page.goto(pathToFileURL(resolve(report)).href, { waitUntil: 'load' });
await page.waitForFunction(() => window.memlens && window.memlens.ready === true);
await page.evaluate((id) => {
  // Show the peak as a click would, then bring the section to the top.
  if (window.memlens.showMoment && window.memlens.timeline) window.memlens.showMoment(window.memlens.timeline.peak);
  const e = document.getElementById(id);
  window.scrollTo({ top: e.getBoundingClientRect().top + window.scrollY - 44, behavior: 'instant' });
}, section);
await page.waitForTimeout(300);
await page.screenshot({ path: out });
await browser.close();
console.log(`ok: ${out}`);
