// A job watched live, as a person watches it: the jobs page is open when
// the job is submitted, and the job appears there without a reload; its
// page shows the answer while the model writes it (each delta added as
// text), then reloads itself once the job has finished, with the
// transcript and the waterfall.
//
// The test holds the model's stream: `control` is its server, whose
// `/submit` submits the job (answering its id) and whose `/release` lets
// the stream go on to its next pause. The stream pauses once, after a
// first part that carries markup meant to run.
//
// Input: { console, token, control }
// Output: what each step saw (tests/tests/console_browser.rs asserts on it).

import { look, run, signIn } from './browser.mjs';

// How long to wait for what a live page shows next.
const WAIT_MS = 20_000;

run(async ({ input, tab, shoot }) => {
  const page = await tab();
  const report = {};
  await signIn(page, input.console, input.token);
  // Set on this document only: gone if the page reloads.
  await page.evaluate(() => { window.__stayed = true; });
  const id = await (await fetch(`${input.control}/submit`)).text();
  await page.waitForSelector(`a[href="/jobs/${id}"]`, { timeout: WAIT_MS });
  report.appeared = { id, stayed: await page.evaluate(() => window.__stayed === true), ...(await look(page)) };
  await shoot(page, 'jobs-live');

  await Promise.all([page.waitForNavigation(), page.click(`a[href="/jobs/${id}"]`)]);
  report.running = await page.$eval('.status', (s) => s.innerText);
  await fetch(`${input.control}/release`);
  await page.waitForFunction(() => {
    const streamed = document.getElementById('streamed');
    return streamed && !streamed.hidden && streamed.textContent.includes('Part one');
  }, { timeout: WAIT_MS });
  report.streaming = {
    answer: await page.$eval('#streamed', (s) => s.textContent),
    state: await page.$eval('[data-state]', (s) => s.innerText),
    events: await page.$$eval('#live ol li', (items) => items.map((i) => i.innerText)),
    ...(await look(page)),
  };
  await shoot(page, 'streaming');

  // The rest of the stream, the job's final event, and the page reloads.
  await Promise.all([page.waitForNavigation({ timeout: WAIT_MS }), fetch(`${input.control}/release`)]);
  report.finished = {
    status: await page.$eval('.status', (s) => s.innerText),
    waterfall: (await page.$('table.waterfall')) !== null,
    ...(await look(page)),
  };
  await shoot(page, 'streamed-job');
  report.seen = page.seen;
  return report;
});
