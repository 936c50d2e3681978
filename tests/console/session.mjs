// One person's session, by keyboard: the skip link, signing in with a
// token (typed, then Enter), the jobs page, a job's page and its
// transcript, cancelling a held job, signing out; then the old session's
// cookie put back, which the console no longer knows.
//
// Input: { console, token, job: "<a finished job's id>", held: "<a job waiting for approval>" }
// Output: what each step saw (tests/tests/console_browser.rs asserts on it).

import { focused, look, pathOf, pressAndWait, run, visit } from './browser.mjs';

// How long the held job's page is reloaded waiting for "cancelled".
const CANCEL_WAIT_MS = 10_000;

run(async ({ browser, input, tab, shoot }) => {
  const base = input.console;
  const page = await tab();
  const report = {};

  // Not signed in: the console sends the browser to sign in.
  report.unsigned = await visit(page, `${base}/jobs`);

  // The first Tab stop is the skip link; it moves on to the form, so
  // the next Tab is the token field, not the header's links.
  await page.keyboard.press('Tab');
  report.first_tab = await focused(page);
  await page.keyboard.press('Enter');
  // Following a fragment link is asynchronous: a loaded machine reads the
  // URL before it changes. A link that goes nowhere still fails below.
  await page.waitForFunction(() => location.hash !== '', { timeout: 5000 }).catch(() => {});
  report.after_skip = { hash: new URL(page.url()).hash };
  await page.keyboard.press('Tab');
  report.tab_after_skip = await focused(page);
  await page.keyboard.type(input.token);
  await shoot(page, 'sign-in');
  report.signed_in = await pressAndWait(page, 'Enter');
  const cookies = await browser.cookies();
  const session = cookies.find((c) => c.name === '__Host-toolfleet-session');
  report.session_cookie = session ? { http_only: session.httpOnly, secure: session.secure, same_site: session.sameSite ?? '' } : null;

  report.jobs = await look(page);
  await shoot(page, 'jobs');
  // The skip link on a signed-in page: past the header's links and its
  // sign-out button, to the filter.
  await page.keyboard.press('Tab');
  report.jobs_first_tab = await focused(page);
  await page.keyboard.press('Enter');
  await page.keyboard.press('Tab');
  report.jobs_tab_after_skip = await focused(page);

  // Opening a job from the list, by keyboard.
  await page.focus(`a[href="/jobs/${input.job}"]`);
  report.opened = await pressAndWait(page, 'Enter');
  report.job = await look(page);
  report.job.labels = await page.$$eval('.transcript .label', (labels) => labels.map((l) => l.innerText));
  await shoot(page, 'job');

  // Cancelling the held job from its page, by keyboard; the page then
  // says so (the runner may take a moment to settle it).
  await visit(page, `${base}/jobs/${input.held}`);
  report.held_before = await page.$eval('.status', (s) => s.innerText);
  await page.focus('form[action$="/cancel"] button');
  report.cancelled = await pressAndWait(page, 'Enter');
  const until = Date.now() + CANCEL_WAIT_MS;
  let status = await page.$eval('.status', (s) => s.innerText);
  while (status !== 'cancelled' && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    await page.reload();
    status = await page.$eval('.status', (s) => s.innerText);
  }
  report.held_after = status;
  report.cancel_button_after = (await page.$('form[action$="/cancel"] button')) !== null;

  // Signing out, by keyboard: back to the sign-in page, and a reload
  // stays there.
  await page.focus('form[action="/sign-out"] button');
  report.signed_out = await pressAndWait(page, 'Enter');
  await page.reload();
  report.reloaded = pathOf(page);
  report.after_sign_out = await visit(page, `${base}/jobs`);
  // The old session's cookie, put back as a copy of it would be: the
  // console has forgotten it.
  if (session) {
    await browser.setCookie(session);
    report.old_cookie = await visit(page, `${base}/jobs`);
  }

  report.seen = page.seen;
  return report;
});
