// What every scenario of the console's browser tests shares: Debian's
// Chromium, headless, driven by puppeteer-core; a watch on each tab for
// what must never happen (a dialog, a script the page did not serve, a
// Content-Security-Policy violation); a look at a page as a person would
// see it; screenshots.
//
// A scenario is a file of this folder that calls `run` with an async
// function. It reads its input (JSON, the first argument) and returns what
// it saw, which `run` prints on stdout as one JSON document for the Rust
// test (tests/src/browser.rs) to assert on. Anything else goes to stderr;
// a scenario that throws exits 1 with the error, the page's address and
// text, and a screenshot `failure.png`.
//
// The harness sets TOOLFLEET_CHROMIUM (the browser), TOOLFLEET_BROWSER_PROFILE
// (a fresh, empty profile dir for this run) and TOOLFLEET_SCREENSHOT_DIR.

import path from 'node:path';
import puppeteer from 'puppeteer-core';

// A run's deadline: the browser is closed and the run fails past it, so
// that no Chromium outlives its test.
const DEADLINE_MS = 90_000;

// The widths a page must be usable at: a laptop and a phone.
export const WIDTHS = { laptop: 1280, phone: 390 };

// Runs `scenario({ browser, input, tab, shoot })` and prints what it returns.
export async function run(scenario) {
  const input = JSON.parse(process.argv[2] ?? '{}');
  const screenshots = process.env.TOOLFLEET_SCREENSHOT_DIR;
  const browser = await puppeteer.launch({
    executablePath: process.env.TOOLFLEET_CHROMIUM,
    headless: true,
    // Over a pipe, not a port: Chromium exits when this process does,
    // however it ends.
    pipe: true,
    userDataDir: process.env.TOOLFLEET_BROWSER_PROFILE,
    // The sandbox needs a setuid helper or user namespaces, and refuses
    // root; these pages are our own, on loopback.
    args: ['--no-sandbox', '--no-first-run', '--no-default-browser-check'],
    defaultViewport: viewport(WIDTHS.laptop),
  });
  let last = null;
  const tab = async () => {
    last = await watchedTab(browser);
    return last;
  };
  const shoot = async (page, name) => {
    const file = `${name}.png`;
    await page.screenshot({ path: path.join(screenshots, file), fullPage: true });
    return file;
  };
  const watchdog = setTimeout(() => {
    console.error(`the scenario ran past its ${DEADLINE_MS} ms deadline`);
    browser.close().finally(() => process.exit(2));
  }, DEADLINE_MS);
  try {
    const report = await scenario({ browser, input, tab, shoot });
    process.stdout.write(`${JSON.stringify(report)}\n`);
  } catch (err) {
    console.error(err?.stack ?? String(err));
    if (last !== null) {
      await describeFailure(last, shoot);
    }
    process.exitCode = 1;
  } finally {
    clearTimeout(watchdog);
    await browser.close();
  }
}

// A viewport `width` pixels wide: a phone's (touch, the page's own
// `meta viewport`) below 800.
export function viewport(width) {
  const phone = width < 800;
  return { width, height: phone ? 844 : 800, deviceScaleFactor: 1, isMobile: phone, hasTouch: phone };
}

// A new tab whose `seen` collects, across its navigations, every dialog
// (dismissed), Content-Security-Policy violation, uncaught error and
// request (`<resource type> <url>`).
async function watchedTab(browser) {
  const page = await browser.newPage();
  page.setDefaultTimeout(15_000);
  const seen = { dialogs: [], csp: [], errors: [], requests: [] };
  page.on('dialog', async (dialog) => {
    seen.dialogs.push(`${dialog.type()}: ${dialog.message()}`);
    await dialog.dismiss();
  });
  page.on('console', (message) => {
    if (/Content Security Policy/i.test(message.text())) {
      seen.csp.push(message.text());
    }
  });
  page.on('pageerror', (err) => seen.errors.push(String(err)));
  page.on('request', (request) => seen.requests.push(`${request.resourceType()} ${request.url()}`));
  // A binding and a script the page itself cannot block (both come over
  // the DevTools protocol, not from the page): the page's own report of
  // what its policy refused.
  await page.exposeFunction('__toolfleetViolation', (what) => seen.csp.push(what));
  await page.evaluateOnNewDocument(() => {
    document.addEventListener('securitypolicyviolation', (event) => {
      window.__toolfleetViolation(`${event.violatedDirective} blocked ${event.blockedURI}: ${event.sample}`);
    });
  });
  page.seen = seen;
  return page;
}

// `url`, loaded: its HTTP status and where it ended, after redirects.
export async function visit(page, url) {
  const response = await page.goto(url, { waitUntil: 'load' });
  return { status: response?.status() ?? 0, path: pathOf(page) };
}

// The page's path and query.
export function pathOf(page) {
  const url = new URL(page.url());
  return url.pathname + url.search;
}

// Presses `key` on what has the focus and waits for the navigation it
// starts.
export async function pressAndWait(page, key) {
  const [response] = await Promise.all([page.waitForNavigation(), page.keyboard.press(key)]);
  return { status: response?.status() ?? 0, path: pathOf(page) };
}

// Signs in as a person does: the token typed into the form, then Enter.
export async function signIn(page, base, token) {
  await visit(page, `${base}/sign-in`);
  await page.focus('#token');
  await page.keyboard.type(token);
  const landed = await pressAndWait(page, 'Enter');
  // The jobs, or for an approver alone the calls held for one.
  if (landed.path !== '/jobs' && landed.path !== '/approvals') {
    throw new Error(`signing in landed on ${landed.path} (${landed.status}), not /jobs`);
  }
}

// What a person sees of the page now, and what must never be there: a
// script that ran (`window.__xss`, which every payload sets), markup that
// should have been text, a page wider than the window.
export async function look(page) {
  return page.evaluate(() => {
    const count = (selector) => document.querySelectorAll(selector).length;
    return {
      path: location.pathname + location.search,
      title: document.title,
      h1: document.querySelector('h1')?.innerText ?? '',
      text: document.body.innerText,
      xss: typeof window.__xss !== 'undefined',
      // The layout's width, not the window's: a phone zooms out to fit
      // a page that is too wide, which widens `innerWidth` with it.
      scroll_width: document.documentElement.scrollWidth,
      client_width: document.documentElement.clientWidth,
      // The console serves no script but its own (a running job's live
      // updates), no image, no frame, no SVG but its waterfall's bars, no
      // inline handler, and links only to its own pages.
      markup: {
        script: count('script:not([src="/assets/console.js"])'),
        img: count('img'),
        svg: count('svg:not(.bar)') + count('svg.bar *:not(rect)'),
        iframe: count('iframe'),
        handlers: [...document.querySelectorAll('*')].filter((el) =>
          [...el.attributes].some((a) => a.name.startsWith('on'))).length,
        javascript_links: [...document.querySelectorAll('[href],[src],[action]')].filter((el) =>
          /^\s*javascript:/i.test(el.getAttribute('href') ?? el.getAttribute('src') ?? el.getAttribute('action'))).length,
      },
    };
  });
}

// The text of the element that has the focus, and whether it is inside
// `main`.
export async function focused(page) {
  return page.evaluate(() => {
    const el = document.activeElement;
    return {
      tag: el?.tagName.toLowerCase() ?? '',
      id: el?.id ?? '',
      text: (el?.innerText ?? '').trim(),
      in_main: Boolean(el && document.querySelector('main')?.contains(el)),
    };
  });
}

async function describeFailure(page, shoot) {
  try {
    const file = await shoot(page, 'failure');
    const text = await page.evaluate(() => document.body?.innerText ?? '');
    console.error(`at ${page.url()} (screenshot ${file}):\n${text.slice(0, 2000)}`);
    console.error(`seen: ${JSON.stringify(page.seen)}`);
  } catch (err) {
    console.error(`(could not describe the page: ${err})`);
  }
}
