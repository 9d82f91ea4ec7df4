// webui_driver.mjs — drives thaw's chat page in headless Chromium (Debian's
// /usr/bin/chromium) with playwright-core, one phase per run; the browser
// profile (its localStorage: the conversations, the key) lives in a folder
// the test keeps across runs, so a phase can follow a server restart.
//
//   node webui_driver.mjs PHASE URL PROFILE_DIR OUT_DIR [KEY]
//   PHASE: chat (new conversation, one turn), continue (one more turn in the
//   conversation the page kept), cache (the #cache view), key (the page asks
//   for KEY on a 401, then chats), controls (stop, regenerate, edit last),
//   render (a canned stream of Markdown, hostile HTML, reasoning and a tool
//   call, answered by the route itself: what the page makes of it), image
//   (KEY is an image file: attached, sent with a message, shown).
//
// Every request to anything but URL's origin is aborted (and listed); the
// result, one JSON line on stdout, also lists console errors and page errors.
import { createRequire } from 'node:module';
import path from 'node:path';

const [phase, url, profile, outDir, key] = process.argv.slice(2);
const npm = process.env.THAW_WEBUI_NPM;
const require = createRequire(path.join(npm, 'noop.js'));
const { chromium } = require('playwright-core');

const origin = new URL(url).origin;
const out = { phase, blocked: [], console_errors: [], page_errors: [], ms: {} };
const t0 = Date.now();
const mark = (what) => { out.ms[what] = Date.now() - t0; };

const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.THAW_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1200, height: phase === 'cache' ? 1000 : 800 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  await ctx.route('**/*', (route) => {
    const u = route.request().url();
    if (u.startsWith('data:') || new URL(u).origin === origin) return route.continue();
    out.blocked.push(u);
    return route.abort('blockedbyclient');
  });
  if (phase === 'render') {
    const chunk = (delta, extra = {}) => 'data: ' + JSON.stringify({
      object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }], ...extra }) + '\n\n';
    const body = [
      chunk({ role: 'assistant', content: '' }),
      chunk({ reasoning_content: 'The user wants a list. ' }),
      chunk({ reasoning_content: 'Keep it short.' }),
      chunk({ content: '# Title\n\nSome **bold** text and a list:\n\n- one\n- two\n\n' }),
      chunk({ content: '```python\ndef f(x):\n    return x + 1\n```\n\n' }),
      chunk({ content: '<script>window.pwned = 1</script><img src="data:," onerror="window.pwned = 2">' }),
      chunk({ content: '<a href="javascript:window.pwned = 3">link</a>' }),
      chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '' } }] }),
      chunk({ tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }),
      chunk({ tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }),
      'data: ' + JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }],
        timings: { cache_n: 900, prompt_n: 20, prompt_ms: 10, prompt_per_token_ms: 0.5, predicted_n: 30, predicted_ms: 300,
          restore_ms: 12.5 }, cache_source: 'blocks' }) + '\n\n',
      'data: ' + JSON.stringify({ object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 920, completion_tokens: 30 } }) + '\n\n',
      'data: [DONE]\n\n',
    ].join('');
    await ctx.route('**/v1/chat/completions', (route) => route.fulfill({
      status: 200, headers: { 'Content-Type': 'text/event-stream; charset=utf-8' }, body }));
  }
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    // the key phase provokes the 401 that makes the page ask for a key
    if (phase === 'key' && /status of 401/.test(m.text())) return;
    // the render phase's hostile HTML: an inline handler DOMPurify is still
    // parsing, refused by the CSP before DOMPurify drops it
    if (phase === 'render' && /Content Security Policy/.test(m.text())) { out.csp_refused = (out.csp_refused || 0) + 1; return; }
    out.console_errors.push(m.text());
  });
  page.on('pageerror', (e) => out.page_errors.push(String(e)));
  const sse = [];
  page.on('response', (r) => {
    if (r.url().endsWith('/v1/chat/completions')) sse.push(r.headers()['content-type'] || '');
  });
  await page.goto(url + (phase === 'cache' ? '#cache' : ''), { waitUntil: 'load' });
  await page.waitForSelector('body[data-ready="1"]', { timeout: 20000 });
  mark('ready');
  const shot = (name) => page.screenshot({ path: path.join(outDir, name + '.png'), fullPage: true });

  async function settings() {
    await page.click('#settings-toggle');
    await page.fill('#set-temperature', '0');
    await page.dispatchEvent('#set-temperature', 'change');
    await page.fill('#set-max-tokens', '12');
    await page.dispatchEvent('#set-max-tokens', 'change');
    // a long system prompt: a prefill worth saving
    const words = 'river stone light garden window paper engine market silver winter question number'.split(' ');
    await page.fill('#set-system', 'You are a helpful assistant. ' +
      Array.from({ length: 500 }, (_, i) => words[(i * 7) % words.length]).join(' '));
    await page.dispatchEvent('#set-system', 'change');
    await page.click('#settings-toggle');
  }

  async function setMax(n) {
    await page.click('#settings-toggle');
    await page.fill('#set-max-tokens', String(n));
    await page.dispatchEvent('#set-max-tokens', 'change');
    await page.click('#settings-toggle');
  }

  // sends `text`, waits for the reply's stats line; returns what the page shows
  async function turn(text) {
    const before = await page.locator('.msg.assistant .stats').count();
    await page.fill('#input', text);
    await page.click('#send');
    mark('sent');
    await page.waitForSelector('.msg.assistant', { timeout: 20000 });
    mark('reply_started');
    // the reply streams into the page before its stats arrive with the last chunk
    await page.waitForFunction((n) => document.querySelectorAll('.msg.assistant .stats').length > n, before,
      { timeout: 120000 });
    mark('reply_done');
    const last = page.locator('.msg.assistant').last();
    return {
      reply: await last.locator('.content').innerText(),
      stats: await last.locator('.stats').innerText(),
      source: (await last.locator('.stats .src').count()) ? await last.locator('.stats .src').textContent() : null,
      n_messages: await page.locator('#messages .msg').count(),
    };
  }

  if (phase === 'chat') {
    await settings();
    await page.click('#new-chat');
    Object.assign(out, await turn('Hello thaw: tell me about **caches**.'));
    await shot('chat');
  } else if (phase === 'continue') {
    out.kept = await page.locator('#messages .msg').count();
    Object.assign(out, await turn('And after a restart?'));
    await shot('chat-restored');
  } else if (phase === 'cache') {
    await page.waitForFunction(() => Number(document.body.dataset.cachePolls || 0) >= 2, null, { timeout: 20000 });
    out.tiles = {};
    for (const t of await page.locator('.tile').all()) {
      out.tiles[(await t.getAttribute('id')).replace(/^tile-/, '')] = await t.locator('.v').innerText();
    }
    out.charts = await page.locator('.chart canvas').count();
    await shot('cache');
  } else if (phase === 'key') {
    await page.waitForSelector('#key-dialog[open]', { timeout: 20000 });
    await shot('key');
    await page.fill('#key-input', key);
    await page.click('#key-save');
    await settings();
    Object.assign(out, await turn('Hello with a key'));
    out.stored_key = await page.evaluate(() => localStorage.getItem('thaw.apiKey'));
  } else if (phase === 'controls') {
    await settings();
    await setMax(100000);
    await page.click('#new-chat');
    await page.fill('#input', 'Write at length.');
    await page.click('#send');
    await page.waitForFunction(() => (document.querySelector('.msg.assistant .content')?.textContent || '').length > 20,
      null, { timeout: 60000 });
    await page.click('#stop');
    await page.waitForFunction(() => document.getElementById('status').textContent === 'stopped', null, { timeout: 20000 });
    out.stopped = { send_enabled: await page.isEnabled('#send'), n: await page.locator('#messages .msg').count(),
      partial: (await page.locator('.msg.assistant .content').innerText()).length };
    await setMax(8);
    await page.click('#regenerate');
    await page.waitForSelector('.msg.assistant .stats', { timeout: 60000 });
    out.regenerated = { n: await page.locator('#messages .msg').count(), stats: await page.locator('.stats').innerText() };
    await page.click('#edit-last');
    out.edit = { input: await page.inputValue('#input'), n: await page.locator('#messages .msg').count() };
    await page.fill('#input', 'Write briefly instead.');
    Object.assign(out, await turn('Write briefly instead.'));
    out.user_texts = await page.locator('.msg.user .content').allInnerTexts();
  } else if (phase === 'image') {
    await settings();
    await page.click('#new-chat');
    await page.setInputFiles('#attach-file', key);
    await page.waitForSelector('#attached .thumb', { timeout: 20000 });
    Object.assign(out, await turn('What is in this picture?'));
    out.images_shown = await page.locator('.msg.user img.image').count();
    out.thumbs_left = await page.locator('#attached .thumb').count();
    out.kept_images = await page.evaluate(() => JSON.parse(localStorage.getItem('thaw.conversations') || '[]')
      .flatMap((c) => c.messages).filter((m) => m.images?.length).length);
    await shot('image');
  } else if (phase === 'render') {
    await page.click('#new-chat');
    Object.assign(out, await turn('Show me everything'));
    const c = page.locator('.msg.assistant .content').last();
    out.render = await c.evaluate((el) => ({
      h1: el.querySelector('h1')?.textContent, bold: el.querySelector('strong')?.textContent,
      items: el.querySelectorAll('li').length, highlighted: !!el.querySelector('pre code.hljs .hljs-keyword'),
      scripts: el.querySelectorAll('script').length,
      handlers: [...el.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith('on')),
      js_links: [...el.querySelectorAll('a')].filter((a) => (a.getAttribute('href') || '').startsWith('javascript')).length,
      pwned: window.pwned ?? null,
    }));
    out.reasoning = await page.locator('.msg.assistant details.reasoning').textContent();
    out.reasoning_open = await page.locator('.msg.assistant details.reasoning').evaluate((d) => d.open);
    out.tool = await page.locator('.msg.assistant .tool-call').innerText();
    await shot('render');
  }
  out.sse = sse;
  mark('done');
} catch (e) {
  out.failure = String(e.stack || e);
} finally {
  await ctx.close();
}
console.log(JSON.stringify(out));
