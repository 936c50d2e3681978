// A person signs in with the company's identity: the console's sign-in
// page sends the browser to the OpenID provider, whose form takes the
// account's name; the provider sends it back with a one-time code, and the
// console signs the person in with the roles the provider gave. No
// address the browser visits carries a credential (the one-time code
// aside).
//
// Input: { console, account }
// Output: what each step saw (tests/tests/console_browser.rs asserts on it).

import { look, run, visit } from './browser.mjs';

run(async ({ browser, input, tab, shoot }) => {
  const page = await tab();
  const report = {};
  await visit(page, `${input.console}/sign-in`);
  const link = await page.$('a[href="/sign-in/oidc"]');
  report.offered = link !== null;
  await Promise.all([page.waitForNavigation(), link.click()]);
  report.provider = { origin: new URL(page.url()).origin, h1: (await look(page)).h1 };
  await shoot(page, 'provider');
  await page.type('#account', input.account);
  // The provider's redirects end on the console, whose page moves on to
  // the person's first.
  await page.click('button[type="submit"]');
  const until = Date.now() + 15_000;
  const first = () => page.url().startsWith(`${input.console}/jobs`) || page.url().startsWith(`${input.console}/approvals`);
  while (!first()) {
    if (Date.now() > until) {
      throw new Error(`the sign-in ended at ${page.url()}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await page.waitForSelector('.who');
  report.landed = await look(page);
  report.who = await page.$eval('.who', (who) => who.innerText);
  await shoot(page, 'signed-in-with-oidc');
  const cookies = await browser.cookies();
  const session = cookies.find((c) => c.name === '__Host-toolfleet-session');
  report.session_cookie = session ? { http_only: session.httpOnly, secure: session.secure, same_site: session.sameSite ?? '' } : null;
  report.cookies = cookies.map((c) => c.name);
  report.documents = page.seen.requests.filter((r) => r.startsWith('document ')).map((r) => r.slice('document '.length));
  report.seen = page.seen;
  return report;
});
