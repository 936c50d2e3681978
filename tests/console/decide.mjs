// The people in the loop, in the browser. An approver decides a round of
// three parallel calls held for approval: approves one as the model wrote
// it, edits another's arguments (reviews the diff, then confirms), rejects
// the third with a reason. An operator gives verdicts on two calls whose
// outcome no worker could tell: one was applied (with the result the model
// gets), the other fails with a reason. A reader sees the same pages with
// no button on them.
//
// Input: { console, approver, operator, reader: "<tokens>",
//          approvals: "<the job of the three held calls>",
//          outcomes: "<the job of the two unknown outcomes>",
//          waiting: "<a job whose call waits for approval, left so>",
//          edited: "<the arguments the approver types for call `two`>",
//          result: "<the result the operator gives call `charge`>" }
// Output: what each step saw (tests/tests/console_browser.rs asserts on it).

import { look, pathOf, run, signIn, visit } from './browser.mjs';

// How long a page is reloaded waiting for what the fleet does next.
const WAIT_MS = 20_000;

run(async ({ input, tab, shoot }) => {
  const base = input.console;
  const report = {};

  const page = await tab();
  await signIn(page, base, input.approver);
  report.approver_held = await heldCalls(page, base, 3);
  await shoot(page, 'approvals');
  // `one`, as the model wrote it.
  report.approved = await submit(page, await section(page, 'one'), 'approve');
  // `two`, edited: the review shows the change before anything is sent.
  const two = await section(page, 'two');
  const box = await two.$('textarea[name="arguments"]');
  await box.evaluate((el) => { el.value = ''; });
  await box.type(input.edited);
  report.review = await submit(page, two, 'approve');
  report.diff = await page.$$eval('pre.diff span', (lines) =>
    lines.map((line) => ({ kind: line.className, text: line.innerText })));
  await shoot(page, 'review');
  report.confirmed = await submit(page, await page.$('main form'), 'approve');
  // `three`, rejected: the reason typed.
  const three = await section(page, 'three');
  await (await three.$('textarea[name="reason"]')).type('not now, it costs too much');
  report.rejected = await submit(page, three, 'reject');
  report.approver_after = await look(page);
  report.approvals_job = await finished(page, `${base}/jobs/${input.approvals}`);
  await shoot(page, 'approved-job');

  const operator = await tab();
  await signIn(operator, base, input.operator);
  report.operator_held = await heldCalls(operator, base, 2);
  await shoot(operator, 'outcomes');
  const charge = await section(operator, 'charge');
  await (await charge.$('textarea[name="result"]')).type(input.result);
  report.applied = await submit(operator, charge, 'applied');
  const mail = await section(operator, 'mail');
  await (await mail.$('textarea[name="reason"]')).type('the mail server was down');
  report.failed = await submit(operator, mail, 'fail');
  report.outcomes_job = await finished(operator, `${base}/jobs/${input.outcomes}`);

  // A reader reads the same jobs and decides nothing: no page of held
  // calls to go to, and no button on the page of a job that waits (where
  // its agent sees Cancel).
  const reader = await tab();
  await signIn(reader, base, input.reader);
  report.reader_nav = await reader.$$eval('nav a', (links) => links.map((a) => a.innerText));
  await visit(reader, `${base}/jobs/${input.waiting}`);
  report.reader_job = await look(reader);
  report.reader_buttons = await reader.$$eval('main button', (buttons) => buttons.map((b) => b.innerText));
  report.reader_approvals = await visit(reader, `${base}/approvals`);
  await shoot(reader, 'reader-approvals');

  report.seen = { approver: page.seen, operator: operator.seen, reader: reader.seen };
  return report;
});

// The held-calls page once it lists `count` calls (the fleet holds them
// a moment after the job is submitted): what a person sees of it.
async function heldCalls(page, base, count) {
  const until = Date.now() + WAIT_MS;
  await visit(page, `${base}/approvals`);
  while ((await page.$$('section.held')).length < count && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    await page.reload();
  }
  const seen = await look(page);
  seen.calls = await page.$$eval('section.held code.call-id', (ids) => ids.map((id) => id.innerText));
  return seen;
}

// The section of the held call `callId`.
async function section(page, callId) {
  for (const held of await page.$$('section.held')) {
    if ((await held.$eval('dd code', (id) => id.innerText)) === callId) {
      return held;
    }
  }
  throw new Error(`no held call ${callId} on ${pathOf(page)}`);
}

// Clicks the button of `decision` inside `within` and waits for the page
// it leads to: where it landed, what it says.
async function submit(page, within, decision) {
  const button = await within.$(`button[value="${decision}"]`);
  if (button === null) {
    throw new Error(`no ${decision} button on ${pathOf(page)}`);
  }
  const [response] = await Promise.all([page.waitForNavigation(), button.click()]);
  const seen = await look(page);
  return { status: response?.status() ?? 0, path: seen.path, h1: seen.h1, text: seen.text };
}

// Job `url`'s page once the job has finished: its status and text.
async function finished(page, url) {
  const until = Date.now() + WAIT_MS;
  await visit(page, url);
  let status = await page.$eval('.status', (s) => s.innerText);
  while (!['succeeded', 'failed', 'cancelled'].includes(status) && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    await page.reload();
    status = await page.$eval('.status', (s) => s.innerText);
  }
  return { status, text: (await look(page)).text };
}
