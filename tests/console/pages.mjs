// Visits pages at each width, as one person (signed in with `token`, if
// given) or as no one, and says for each what a person saw and what must
// never happen (tests/src/browser.rs runs it).
//
// Input: { console: "http://localhost:<port>", token?: "...",
//          pages: [{ name: "jobs", path: "/jobs" }, ...],
//          widths?: [1280, 390], screenshots?: true }
// Output: { visits: [{ name, width, status, path, title, h1, text, xss,
//           scroll_width, inner_width, markup, dialogs, csp, errors,
//           requests, screenshot }] }

import { WIDTHS, look, run, signIn, viewport, visit } from './browser.mjs';

run(async ({ input, tab, shoot }) => {
  const page = await tab();
  if (input.token) {
    await signIn(page, input.console, input.token);
  }
  const visits = [];
  for (const width of input.widths ?? [WIDTHS.laptop, WIDTHS.phone]) {
    await page.setViewport(viewport(width));
    for (const { name, path } of input.pages) {
      // What this visit alone saw.
      const before = Object.fromEntries(Object.entries(page.seen).map(([k, v]) => [k, v.length]));
      const loaded = await visit(page, `${input.console}${path}`);
      const looked = await look(page);
      const seen = Object.fromEntries(Object.entries(page.seen).map(([k, v]) => [k, v.slice(before[k])]));
      const screenshot = input.screenshots === false ? null : await shoot(page, `${name}-${width}`);
      visits.push({ name, width, status: loaded.status, ...looked, ...seen, screenshot });
    }
  }
  return { visits };
});
