// The chat page of `kiln serve` in headless Chromium (Debian's chromium),
// driven by npm's playwright-core (pinned in scripts/deps.sh; no browser
// download: executablePath is Debian's binary). Run by
// tests/e2e/run_webui.sh, which starts the servers. Each check compares what
// the page shows with what the server's API answers for the same request.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    chromium: { type: 'string' }, modules: { type: 'string' },
    demo: { type: 'string' }, vlm: { type: 'string' }, think: { type: 'string' },
    key: { type: 'string' }, image: { type: 'string' }, shots: { type: 'string' },
  },
});

let failures = 0;
function check(ok, what, detail) {
  if (ok) console.log('ok   ' + what);
  else {
    failures++;
    console.log('FAIL ' + what + (detail !== undefined ? ': ' + JSON.stringify(detail) : ''));
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------- the browser

let page;
const consoleErrors = [];
// a WebDriver-style key at the end of a text: \uE007 Enter, \uE004 Tab
const KEYS = { '\uE007': 'Enter', '\uE004': 'Tab' };
const click = async (css) => page.click(css, { timeout: 10000 });
async function type(css, text) {
  const key = KEYS[text.slice(-1)];
  const body = key ? text.slice(0, -1) : text;
  if (body) await page.locator(css).pressSequentially(body);
  if (key) await page.locator(css).press(key);
}
const clear = async (css) => page.fill(css, '');
// a script in WebDriver's form (a function body reading arguments[k]),
// evaluated by the DevTools protocol (the page's CSP does not apply to it)
const js = (script, ...args) => page.evaluate(`(function () { ${script} }).apply(null, ${JSON.stringify(args)})`);
const go = (url) => page.goto(url);

async function setField(css, text) {
  await clear(css);
  if (text !== '') await type(css, text);
}

async function waitFor(what, fn, ms = 10000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error('timed out waiting for ' + what);
    await sleep(25);
  }
}

async function shot(name) {
  const path = opt.shots + '/' + name + '.png';
  await page.screenshot({ path });
  console.log('     screenshot ' + path);
}

// ---------------------------------------------------------------- the page

// The last message of a role: its state, content text, reasoning, stats.
const lastMsg = (role) => js(`
  const all = document.querySelectorAll('#messages .msg.' + arguments[0]);
  const m = all[all.length - 1];
  if (!m) return null;
  const d = m.querySelector('.reasoning');
  return {state: m.dataset.state || null, text: m.querySelector('.content').textContent,
          reasoning: d ? d.querySelector('.reasoning-text').textContent : '', reasoningShown: d ? !d.hidden : false,
          reasoningOpen: d ? d.open : false, stats: (m.querySelector('.stats') || {}).textContent || '',
          count: all.length, images: m.querySelectorAll('.images img').length};`, role);

async function ready(model) {
  await waitFor('the model name and ready', async () =>
    js(`return document.getElementById('model').textContent === arguments[0] &&
               document.getElementById('status').textContent.startsWith('ready')`, model));
}

// Types a message and sends it (Enter, or the Send button), then follows the
// reply until it ends: the texts seen while it streamed, and the end.
async function sendAndFollow(text, { enter = false } = {}) {
  const before = (await lastMsg('assistant'))?.count || 0;
  await type('#input', text);
  if (enter) await type('#input', '\uE007');
  else await click('#send');
  const seen = [];
  const end = await waitFor('the reply to end', async () => {
    const m = await lastMsg('assistant');
    const err = await lastMsg('error');
    if (err && (!m || m.count === before)) return { error: err.text };
    if (!m || m.count === before) return null;
    if (m.state === 'streaming') {
      seen.push(m.text);
      return null;
    }
    return m;
  }, 20000);
  return { seen, end };
}

async function api(base, body, key) {
  const h = { 'Content-Type': 'application/json' };
  if (key) h.Authorization = 'Bearer ' + key;
  const r = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: h, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

// ---------------------------------------------------------------- checks

const SYSTEM = 'You are terse.';
const Q1 = 'Tell me something wise.';

async function demoChecks() {
  const base = opt.demo;
  const ref = await api(base, {
    model: 'kiln-demo', temperature: 0, seed: 7, max_tokens: 40,
    messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: Q1 }],
  });
  const want = ref.json.choices[0].message.content;
  check(ref.status === 200 && want.length > 0 && !want.includes('`') && !want.includes('**'),
    'reference reply (greedy, non-streamed) is plain text', ref.json);

  await go(base + '/');
  await ready('kiln-demo');
  check(await js(`return document.getElementById('attach').hidden`), 'no image button for a text-only model');
  await click('#settings-toggle');
  await type('#system', SYSTEM);
  await type('#temperature', '0');
  await type('#seed', '7');
  await type('#max_tokens', '40');

  // the reply streams, then equals the non-streamed one
  const r1 = await sendAndFollow(Q1, { enter: true });
  check(r1.end.state === 'done' && r1.end.text === want, 'streamed reply equals /v1/chat/completions', { got: r1.end, want });
  const partial = r1.seen.filter((t) => t.length > 0 && t.length < want.length && want.startsWith(t));
  check(partial.length >= 2, 'the reply was shown while it streamed (proper prefixes seen)', r1.seen.length);
  const fin = ref.json.choices[0].finish_reason === 'length' ? ' · stopped at max_tokens' : '';
  check(new RegExp('^' + ref.json.usage.completion_tokens + ' tokens · [0-9.]+ tokens/s · first token [0-9.]+ s' + fin + '$').test(r1.end.stats),
    'tokens (the usage\'s), tokens/s and the finish shown', [r1.end.stats, ref.json.usage]);
  check(!r1.end.reasoningShown, 'no reasoning block without reasoning_content');
  const stored = await js(`return JSON.parse(localStorage.getItem('kiln.webui.conversations'))`);
  check(stored.length === 1 && stored[0].messages[1].content === want && stored[0].title === Q1,
    'conversation kept in localStorage', stored);
  await shot('webui-reply');

  // Stop: the stream is aborted, the text stays as it was, the server frees the sequence
  await setField('#max_tokens', '150');
  await type('#input', 'And another one?');
  await click('#send');
  await waitFor('the second reply to start', async () => {
    const m = await lastMsg('assistant');
    return m.count === 2 && m.state === 'streaming' && m.text.length > 0;
  });
  await click('#stop');
  const stopped = await waitFor('the reply to stop', async () => {
    const m = await lastMsg('assistant');
    return m.state !== 'streaming' && m;
  }, 3000);
  await sleep(300);
  const after = await lastMsg('assistant');
  const n = Number(/^(\d+) tokens?/.exec(stopped.stats)?.[1]);
  check(stopped.state === 'stopped' && after.text === stopped.text && stopped.stats.endsWith('· stopped') && n > 0 && n < 150,
    'Stop ends the reply where it was', { stopped, after });
  check(await js(`return document.getElementById('stop').hidden && !document.getElementById('send').disabled`),
    'Stop button hidden and Send enabled again');
  const idle = await waitFor('the server to drop the stopped sequence', async () => {
    const slots = await (await fetch(base + '/slots')).json();
    return slots.every((x) => !x.is_processing);
  }, 3000).catch(() => false);
  check(idle, 'the server cancelled the stopped request (no slot processing)');

  // server errors are shown: a bad parameter and a too-long max_tokens, as the API words them
  for (const [field, value] of [['temperature', '-1'], ['max_tokens', '100000']]) {
    await setField('#' + field, value);
    const before = (await js(`return document.querySelectorAll('#messages .msg.error').length`));
    await type('#input', 'Hi');
    await click('#send');
    await waitFor('the error', async () => js(`return document.querySelectorAll('#messages .msg.error').length > arguments[0]`, before));
    const shown = (await lastMsg('error')).text;
    // the same request: the stored conversation (the new turn included) after the system prompt
    const conv = (await js(`return JSON.parse(localStorage.getItem('kiln.webui.conversations'))`))[0];
    const messages = [{ role: 'system', content: SYSTEM }].concat(conv.messages
      .filter((x) => x.role === 'user' || (x.role === 'assistant' && x.content)).map((x) => ({ role: x.role, content: x.content })));
    const body = { model: 'kiln-demo', messages, max_tokens: 150, temperature: 0, seed: 7 };
    body[field] = Number(value);
    const e = await api(base, body);
    check(e.status === 400 && shown === 'HTTP 400: ' + e.json.error.message, `a server error is shown (${field} ${value})`,
      { shown, api: e.json });
    await setField('#' + field, field === 'temperature' ? '0' : '40');
  }
  await shot('webui-error');

  // conversations survive a reload; new and delete
  await go(base + '/');
  await ready('kiln-demo');
  const restored = await js(`return [document.querySelectorAll('#conversations li').length,
      document.querySelector('#messages .msg.assistant .content').textContent,
      document.getElementById('system').value, document.getElementById('temperature').value]`);
  check(restored[0] === 1 && restored[1] === want && restored[2] === SYSTEM && restored[3] === '0',
    'conversation and settings restored after a reload', restored);
  await click('#settings-toggle');
  await click('#new-chat');
  check(await js(`return document.querySelectorAll('#messages .msg').length === 0`), 'New chat starts empty');
  await setField('#max_tokens', '3');
  await sendAndFollow('Short one.');
  check(await js(`return document.querySelectorAll('#conversations li').length === 2 &&
      document.querySelector('#conversations li.current .open').textContent === 'Short one.'`),
    'the new conversation is listed first and current');
  await click('#conversations li:nth-child(2) .delete');
  const left = await js(`return [Array.from(document.querySelectorAll('#conversations li .open')).map((b) => b.textContent),
      JSON.parse(localStorage.getItem('kiln.webui.conversations')).map((c) => c.title)]`);
  check(JSON.stringify(left) === JSON.stringify([['Short one.'], ['Short one.']]), 'Delete removes a conversation (page and storage)', left);

  // model text is never HTML: markup stays text, code fences become <pre><code>
  const evil = 'x <img src=x onerror="window.pwned=1"> <b>bold</b>\n```js\nlet a = "<i>";\n```\ninline `<u>` end';
  await js(`const c = JSON.parse(localStorage.getItem('kiln.webui.conversations'));
      c[0].messages.push({role: 'assistant', content: arguments[0], reasoning: '<script>x</script>', state: 'done'});
      localStorage.setItem('kiln.webui.conversations', JSON.stringify(c));`, evil);
  await go(base + '/');
  await ready('kiln-demo');
  const dom = await js(`const all = document.querySelectorAll('#messages .msg.assistant .content');
      const m = all[all.length - 1];
      return [m.querySelectorAll('img, b, i, u, script').length, m.querySelector('pre code')?.textContent,
              m.querySelector('pre code')?.dataset.lang, m.textContent, window.pwned === undefined,
              m.parentNode.querySelector('.reasoning-text').textContent]`);
  check(dom[0] === 0 && dom[1] === 'let a = "<i>";' && dom[2] === 'js' && dom[4] &&
      dom[3] === 'x <img src=x onerror="window.pwned=1"> <b>bold</b>let a = "<i>";inline <u> end' &&
      dom[5] === '<script>x</script>', 'model text rendered as text, code blocks as <pre><code>', dom);

  // headings and lists, their text still text
  const md = '## Steps <b>now</b>\n- one\n- **two** <i>x</i>\n3. third\n4. fourth\nend';
  await js(`const c = JSON.parse(localStorage.getItem('kiln.webui.conversations'));
      c[0].messages.push({role: 'assistant', content: arguments[0], state: 'done'});
      localStorage.setItem('kiln.webui.conversations', JSON.stringify(c));`, md);
  await go(base + '/');
  await ready('kiln-demo');
  const md2 = await js(`const all = document.querySelectorAll('#messages .msg.assistant .content');
      const m = all[all.length - 1];
      return [m.querySelector('h2')?.textContent, Array.from(m.querySelectorAll('ul > li')).map((e) => e.textContent),
              m.querySelector('ul > li strong')?.textContent, Array.from(m.querySelectorAll('ol > li')).map((e) => e.textContent),
              m.querySelector('ol')?.start, m.querySelectorAll('b, i').length, m.lastChild.textContent]`);
  check(md2[0] === 'Steps <b>now</b>' && JSON.stringify(md2[1]) === JSON.stringify(['one', 'two <i>x</i>']) &&
      md2[2] === 'two' && JSON.stringify(md2[3]) === JSON.stringify(['third', 'fourth']) && md2[4] === 3 && md2[5] === 0 &&
      md2[6] === 'end', 'headings and lists rendered, their text still text', md2);

  // tables and links: cells and link text stay text; only http(s) and mailto
  // become links, opened with noopener noreferrer
  const tl = '| Name | Size |\n|:--|--:|\n| <b>a</b> | [site](https://example.com/x?a=1) |\n| **b** | 2 \\| 3 |\n' +
    'see [mail](mailto:me@example.com), [bad](javascript:window.pwned=2), [data](data:text/html,<b>x</b>) ' +
    '[up](JaVaScRiPt:alert(1)) and [dq](https://a.example/"onmouseover="x)';
  await js(`const c = JSON.parse(localStorage.getItem('kiln.webui.conversations'));
      c[0].messages.push({role: 'assistant', content: arguments[0], state: 'done'});
      localStorage.setItem('kiln.webui.conversations', JSON.stringify(c));`, tl);
  await go(base + '/');
  await ready('kiln-demo');
  const t = await js(`const all = document.querySelectorAll('#messages .msg.assistant .content');
      const m = all[all.length - 1];
      const rows = Array.from(m.querySelectorAll('table tr')).map((r) => Array.from(r.children).map((c) => c.tagName + ':' + c.textContent));
      const links = Array.from(m.querySelectorAll('a')).map((a) => [a.textContent, a.getAttribute('href'), a.rel, a.target,
        a.getAttributeNames().sort().join(',')]);
      return [rows, links, m.querySelectorAll('b, script, img').length, m.querySelector('td strong')?.textContent,
              m.querySelector('th').style.textAlign, m.querySelector('td:nth-child(2)').style.textAlign, window.pwned === undefined]`);
  const wantRows = [['TH:Name', 'TH:Size'], ['TD:<b>a</b>', 'TD:site'], ['TD:b', 'TD:2 | 3']];
  const wantLinks = [['site', 'https://example.com/x?a=1', 'noopener noreferrer', '_blank', 'href,rel,target'],
    ['mail', 'mailto:me@example.com', 'noopener noreferrer', '_blank', 'href,rel,target'],
    ['dq', 'https://a.example/%22onmouseover=%22x', 'noopener noreferrer', '_blank', 'href,rel,target']];
  check(JSON.stringify(t[0]) === JSON.stringify(wantRows) && JSON.stringify(t[1]) === JSON.stringify(wantLinks) && t[2] === 0 &&
      t[3] === 'b' && t[4] === 'left' && t[5] === 'right' && t[6], 'tables and http(s)/mailto links rendered, safely', t);
  await shot('webui-markdown');
}

async function visionChecks() {
  const base = opt.vlm;
  await js(`localStorage.clear()`);
  await go(base + '/');
  await ready('tiny-vl');
  check(await js(`return !document.getElementById('attach').hidden`), 'image button shown for a vision model');
  await click('#settings-toggle');
  await type('#temperature', '0');
  await type('#seed', '1');
  await type('#max_tokens', '8');
  await page.setInputFiles('#image-file', opt.image);
  await waitFor('the attachment preview', async () => js(`return document.querySelectorAll('#attachments img').length === 1`));
  const url = await js(`return document.querySelector('#attachments img').src`);
  const r = await sendAndFollow('What is this?');
  const ref = await api(base, {
    model: 'tiny-vl', temperature: 0, seed: 1, max_tokens: 8,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url } }] }],
  });
  const want = ref.json.choices?.[0]?.message?.content;
  check(url.startsWith('data:image/png;base64,') && ref.status === 200 && r.end.state === 'done' && r.end.text === want,
    'a reply about an uploaded image equals the API\'s for the same data URL', { got: r.end, api: ref.json });
  check((await lastMsg('user')).images === 1 && await js(`return document.querySelectorAll('#attachments img').length === 0`),
    'the image shows in the sent message and leaves the composer');
  await shot('webui-image');
}

async function reasoningChecks() {
  const base = opt.think;
  await js(`localStorage.clear()`);
  await go(base + '/');
  await waitFor('the 401 to be shown', async () => js(`return /^HTTP 401: .*set the API key in Settings/.test(document.getElementById('status').textContent)`));
  check(true, 'a missing API key is shown');
  await click('#settings-toggle');
  await type('#api-key', opt.key + '\uE004'); // Tab: the change event
  await ready('tiny-r1');
  await type('#temperature', '0');
  await type('#seed', '3');
  await type('#max_tokens', '20');
  const r = await sendAndFollow('Think first.');
  const ref = await api(base, {
    model: 'tiny-r1', temperature: 0, seed: 3, max_tokens: 20, messages: [{ role: 'user', content: 'Think first.' }],
  }, opt.key);
  const m = ref.json.choices?.[0]?.message || {};
  check(ref.status === 200 && m.reasoning_content && r.end.reasoning === m.reasoning_content && r.end.text === (m.content || ''),
    'reasoning_content and content streamed apart, as the API gives them', { got: r.end, api: ref.json });
  check(r.end.reasoningShown && !r.end.reasoningOpen, 'reasoning shown collapsed');
  await shot('webui-reasoning');
}

// ---------------------------------------------------------------- main

const require = createRequire(opt.modules + '/');
const { chromium } = require('playwright-core');
let browser, code = 1;
try {
  browser = await chromium.launch({
    executablePath: opt.chromium, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
  });
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  page = await context.newPage();
  page.setDefaultTimeout(10000);
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push('page error: ' + e.message));
  const pw = JSON.parse(readFileSync(opt.modules + '/playwright-core/package.json', 'utf8')).version;
  console.log(`chromium ${browser.version()}, playwright-core ${pw}, node ${process.version}`);
  for (const [name, fn] of [['demo', demoChecks], ['vision', visionChecks], ['reasoning', reasoningChecks]]) {
    try {
      await fn();
    } catch (e) {
      failures++;
      console.log(`FAIL ${name}: ${e.stack || e}`);
      await shot('webui-failed-' + name).catch(() => {});
    }
  }
  // the browser's console: script errors, CSP refusals (the 4xx the checks caused are expected)
  const logs = consoleErrors.filter((m) => !/Failed to load resource: the server responded with a status of 4\d\d/.test(m));
  check(logs.length === 0, 'no script errors or refused resources in the console', logs);
  if (failures === 0) console.log('all checks passed');
  code = failures ? 1 : 0;
} catch (e) {
  console.log('FAIL ' + (e.stack || e));
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
