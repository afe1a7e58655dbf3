// The chat page in a real browser: Debian's chromium, driven over the DevTools protocol by
// puppeteer-core, against `osprey serve` on the demo model on loopback.
//   node tests/webui/webui_browser_test.mjs OSPREY_BINARY ARTIFACT_DIR
// Exit 0: every step passed; 77: no chromium (skipped); else failed, naming the step.
// OSPREY_CHROMIUM names another browser binary than /usr/bin/chromium.
// Screenshots of each step go to ARTIFACT_DIR.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import http from 'node:http';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));
const source = resolve(here, '..', '..');
const [binary, artifacts = join(tmpdir(), 'osprey-webui-artifacts')] = process.argv.slice(2);
const CHROMIUM = process.env.OSPREY_CHROMIUM || ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
if (!CHROMIUM) {
  console.log('SKIP: no chromium (apt-get install chromium; scripts/setup.sh --tests installs it)');
  process.exit(77);
}
if (!binary || !existsSync(binary)) {
  console.error(`usage: node webui_browser_test.mjs OSPREY_BINARY ARTIFACT_DIR (no binary at '${binary}')`);
  process.exit(2);
}
let puppeteer;
try {
  puppeteer = (await import('puppeteer-core')).default;
} catch {
  console.error('tests/webui/node_modules has no puppeteer-core: run scripts/setup.sh --tests (npm ci in tests/webui)');
  process.exit(1);
}
mkdirSync(artifacts, { recursive: true });

let step = 'start';
const fail = (message) => {
  throw new Error(`${step}: ${message}`);
};
const check = (cond, message) => {
  if (!cond) fail(message);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, fn, timeoutMs = 20000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) fail(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

// ---- the server ----

function startServer(extra = []) {
  return new Promise((resolveStart, rejectStart) => {
    const args = ['serve', '--model', join(source, 'models', 'demo'), '--port', '0', ...extra];
    const proc = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...serverEnv } });
    let log = '';
    const onData = (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.port) {
        proc.port = Number(m[1]);
        proc.base = `http://127.0.0.1:${proc.port}`;
        resolveStart(proc);
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      if (!proc.port) rejectStart(new Error(`osprey serve exited (${code}) before listening:\n${log}`));
    });
    proc.log = () => log;
  });
}

function request(base, path, { method = 'GET', body, headers = {} } = {}) {
  return new Promise((resolveReq, rejectReq) => {
    const req = http.request(`${base}${path}`, { method, headers: { 'Content-Type': 'application/json', ...headers } }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolveReq({ status: res.statusCode, body: data }));
    });
    req.on('error', rejectReq);
    if (body) req.write(typeof body === 'string' ? body : JSON.stringify(body));
    req.end();
  });
}

async function metric(base, name, headers) {
  const { body } = await request(base, '/metrics', { headers });
  const m = body.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  if (!m) fail(`/metrics has no ${name}`);
  return Number(m[1]);
}

async function waitReady(base, headers) {
  await until('/health', async () => (await request(base, '/health').catch(() => ({ status: 0 }))).status === 200, 60000);
}

// ---- page helpers ----

async function shot(page, name) {
  await page.screenshot({ path: join(artifacts, `${name}.png`) });
}

const lastReplyText = (page) => page.evaluate(() => {
  const all = document.querySelectorAll('.msg.assistant .content');
  return all.length ? all[all.length - 1].textContent : '';
});
const storedConversations = (page) => page.evaluate(() => JSON.parse(localStorage.getItem('osprey.conversations') || '[]'));
const currentConversation = async (page) => {
  const id = await page.evaluate(() => localStorage.getItem('osprey.current'));
  return (await storedConversations(page)).find((c) => c.id === id);
};

// The conversation as stored once the page has saved a reply's final state: the page writes
// localStorage in an effect after it renders, so the DOM can show a finished reply a moment
// before the store holds it. `final(m)` tells the reply's final state (its stats, or whether it
// was stopped, are set only then).
async function storedAfter(page, index, final) {
  let conv;
  await until(`the page to store reply ${index}'s final state`, async () => {
    conv = await currentConversation(page);
    return conv && conv.messages.length > index && final(conv.messages[index]);
  }, 10000);
  return conv;
}
const finished = (m) => m.stats != null;

async function openSettings(page) {
  if (!(await page.$('.settings'))) await page.click('button[aria-label="Settings"]');
  await page.waitForSelector('.settings');
}
async function setField(page, selector, value) {
  await page.$eval(selector, (el) => { el.value = ''; });
  await page.focus(selector);
  await page.keyboard.down('Control');
  await page.keyboard.press('A');
  await page.keyboard.up('Control');
  await page.keyboard.press('Backspace');
  if (value !== '') await page.type(selector, value);
}
async function sendMessage(page, text) {
  await page.focus('textarea[aria-label="Message"]');
  await page.type('textarea[aria-label="Message"]', text);
  await page.keyboard.press('Enter');  // Enter sends: the keyboard path
}
const busy = (page) => page.$('[data-testid="stop"]').then((h) => h !== null);

// ---- the run ----

const serverEnv = {
  // One CPU thread and the plain x86-64 kernels: the demo model then writes slowly enough that
  // Stop lands mid-reply.
  OSPREY_THREADS: '1',
  OSPREY_CPU_LEVEL: 'scalar',
};
const servers = [];
const scratch = [];  // folders removed at the end
let browser;
const pageErrors = [];

function watch(page) {
  page.on('pageerror', (e) => pageErrors.push(`${step}: ${e.message}`));
  page.on('console', (m) => {
    // A refused request shows in the console as a failed resource load; anything else is a bug.
    // So does the script the sanitizing step injects to see the Content-Security-Policy refuse it.
    const expected = /Failed to load resource/.test(m.text()) ||
      (step === 'sanitized reply' && /Content Security Policy/.test(m.text()));
    if (m.type() === 'error' && !expected) pageErrors.push(`${step}: console: ${m.text()}`);
  });
  return page;
}

// One scenario, long because its steps run in order on the state the one before left (the
// conversation sent is the one stopped, reloaded, renamed, exported and imported).
async function main() {
  const plain = await startServer();
  servers.push(plain);
  await waitReady(plain.base);
  const profile = mkdtempSync(join(tmpdir(), 'osprey-webui-profile-'));
  const downloads = mkdtempSync(join(tmpdir(), 'osprey-webui-downloads-'));
  scratch.push(profile, downloads);
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    args: [...(process.getuid && process.getuid() === 0 ? ['--no-sandbox'] : []), '--disable-gpu', '--no-first-run'],
  });
  const context = browser.defaultBrowserContext();
  await context.overridePermissions(plain.base, ['clipboard-read', 'clipboard-write', 'clipboard-sanitized-write']);
  const page = watch(await browser.newPage());
  await page.setViewport({ width: 1200, height: 800 });

  step = 'load';
  const response = await page.goto(plain.base, { waitUntil: 'load' });
  check(response.status() === 200, `GET / answered ${response.status()}`);
  check(response.headers()['content-encoding'] === 'gzip', `content-encoding ${response.headers()['content-encoding']}`);
  check(/^text\/html/.test(response.headers()['content-type']), `content-type ${response.headers()['content-type']}`);
  await until('the model name from /v1/models', async () => (await page.$eval('[data-testid="model"]', (e) => e.textContent)) === 'demo');
  await shot(page, '01-loaded');

  step = 'send and stream';
  // A greedy reply, so the test can ask the server for the same reply itself.
  await openSettings(page);
  await setField(page, 'input[name="temperature"]', '0');
  await setField(page, 'input[name="max_tokens"]', '60');
  await page.click('button[aria-label="Close settings"]');
  const prompt = 'It is a truth universally acknowledged';
  // Every render of the reply, seen by the page itself (a MutationObserver), so that the count
  // does not depend on how often this process polls a loaded machine.
  await page.evaluate(() => {
    window.__replyLengths = new Set();
    new MutationObserver(() => {
      const all = document.querySelectorAll('.msg.assistant .content');
      const text = all.length ? all[all.length - 1].textContent : '';
      if (text) window.__replyLengths.add(text.length);
    }).observe(document.body, { childList: true, subtree: true, characterData: true });
  });
  await sendMessage(page, prompt);
  let shotTaken = false;
  await until('the reply to stream in', async () => {
    const text = await lastReplyText(page);
    if (!shotTaken && text) {
      await shot(page, '02-streaming');
      shotTaken = true;
    }
    return !(await busy(page)) && text.length > 0;
  }, 60000);
  // Streamed: the page showed part of the reply before all of it. (How many partial renders a
  // loaded machine's browser gets in is its scheduler's business: one is enough to tell.)
  const lengths = await page.evaluate(() => [...window.__replyLengths]);
  const finalLength = (await lastReplyText(page)).length;
  const partial = lengths.filter((n) => n < finalLength).length;
  check(partial >= 1, `the reply arrived whole (renders of lengths ${JSON.stringify(lengths)}, final ${finalLength}); a streamed reply shows parts first`);
  let conv = await storedAfter(page, 1, finished);
  check(conv.title === prompt, `the conversation is named '${conv.title}'`);
  const reference = JSON.parse((await request(plain.base, '/v1/chat/completions', {
    method: 'POST', body: { messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 60 },
  })).body);
  const refText = reference.choices[0].message.content;
  const stats = await page.$eval('.msg.assistant [data-testid="stats"]', (e) => e.textContent);
  check(new RegExp(`\\b${reference.usage.completion_tokens} tokens\\b`).test(stats) && /[0-9.]+ tokens\/s/.test(stats) &&
    /first token \d+ ms/.test(stats), `the stats line says '${stats}'`);
  check(conv.messages[1].content === refText, `the page assembled '${conv.messages[1].content}', the server's own reply is '${refText}'`);
  await shot(page, '03-reply');

  step = 'copy';
  await page.click('.msg.assistant button[aria-label="Copy message"]');
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  check(copied === refText, `the clipboard holds '${copied}'`);

  step = 'stop';
  await openSettings(page);
  await setField(page, 'input[name="max_tokens"]', '400');
  await page.click('button[aria-label="Close settings"]');
  const cancelledBefore = await metric(plain.base, 'osprey:requests_cancelled_total');
  await sendMessage(page, 'Tell me about Mr. Darcy.');
  await until('the second reply to start', async () => (await lastReplyText(page)).length > 20, 30000);
  check((await metric(plain.base, 'osprey:num_requests_running')) === 1, 'no request is running while the reply streams');
  await page.click('[data-testid="stop"]');
  const stoppedAt = Date.now();
  await until('the server to free the slot', async () => (await metric(plain.base, 'osprey:num_requests_running')) === 0, 3000);
  const freedMs = Date.now() - stoppedAt;
  check((await metric(plain.base, 'osprey:requests_cancelled_total')) === cancelledBefore + 1, 'the server did not count the request as cancelled');
  await until('the reply to show it was stopped', () => page.evaluate(() => {
    const replies = document.querySelectorAll('.msg.assistant');
    return replies.length === 2 && replies[1].querySelector('[data-testid="stopped"]') !== null;
  }));
  check(!(await busy(page)), 'the Stop button is still shown');
  conv = await storedAfter(page, 3, (m) => 'stopped' in m);
  check(conv.messages.length === 4 && conv.messages[3].stopped, 'the stopped reply is not kept');
  console.log(`stop: slot freed ${freedMs} ms after the click`);
  await shot(page, '04-stopped');

  step = 'regenerate';
  await openSettings(page);
  await setField(page, 'input[name="max_tokens"]', '30');
  await page.click('button[aria-label="Close settings"]');
  await page.click('button[aria-label="Regenerate reply"]');
  await until('the regenerated reply', async () => !(await busy(page)) && (await lastReplyText(page)).length > 0, 60000);
  conv = await storedAfter(page, 3, finished);
  check(conv.messages.length === 4 && !conv.messages[3].stopped && conv.messages[3].content.length > 0, 'regenerate did not replace the last reply');

  step = 'edit and resend';
  const edits = await page.$$('button[aria-label="Edit and resend"]');
  await edits[1].click();
  await setField(page, 'textarea[aria-label="Edit message"]', 'Tell me about Emma.');
  await page.keyboard.press('Enter');
  await until('the reply to the edited turn', async () => !(await busy(page)) && (await lastReplyText(page)).length > 0, 60000);
  conv = await storedAfter(page, 3, finished);
  check(conv.messages.length === 4 && conv.messages[2].content === 'Tell me about Emma.', 'the edited turn was not resent in place');

  step = 'reload';
  const before = await currentConversation(page);
  await page.reload({ waitUntil: 'load' });
  await page.waitForSelector('.msg.assistant');
  const texts = await page.$$eval('.msg .content', (els) => els.map((e) => e.textContent));
  check(texts.length === 4 && texts[0] === prompt && texts[2] === 'Tell me about Emma.', `after reload the page shows ${JSON.stringify(texts)}`);
  check(JSON.stringify(await currentConversation(page)) === JSON.stringify(before), 'the stored conversation changed across the reload');
  await shot(page, '05-reloaded');

  step = 'conversations';
  await page.click('.side-actions button.primary');
  await until('a second conversation', async () => (await storedConversations(page)).length === 2);
  await page.click(`button[aria-label="Rename ${prompt}"]`);
  await setField(page, 'input[aria-label="Conversation name"]', 'Austen');
  await page.keyboard.press('Enter');
  await until('the rename', async () => (await storedConversations(page)).some((c) => c.title === 'Austen'));
  const cdp = await page.createCDPSession();
  await cdp.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: downloads });
  await page.click('::-p-text(Export)');
  const file = await until('the export file', async () => readdirSync(downloads).find((f) => f.endsWith('.json')));
  await sleep(100);
  const exported = JSON.parse(readFileSync(join(downloads, file), 'utf8'));
  check(exported.conversations.length === 2 && exported.conversations.some((c) => c.title === 'Austen' && c.messages.length === 4),
    'the export does not hold both conversations');
  await page.click('button[aria-label="Delete Austen"]');
  await page.click('button[aria-label="Really delete Austen"]');
  await until('the delete', async () => (await storedConversations(page)).length === 1);
  const importPath = join(downloads, 'import.json');
  writeFileSync(importPath, JSON.stringify(exported));
  const input = await page.$('[data-testid="import"]');
  await input.uploadFile(importPath);
  await until('the import', async () => (await storedConversations(page)).length === 3);
  writeFileSync(importPath, '{"conversations": [{"title": 5}]}');
  await input.uploadFile(importPath);
  const banner = await until('the import error', () => page.$eval('[data-testid="banner"]', (e) => e.textContent).catch(() => ''));
  check(/Cannot import/.test(banner) && /"title"/.test(banner), `the bad import says '${banner}'`);

  step = 'theme';
  const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const theme0 = await page.evaluate(() => document.documentElement.dataset.theme);
  const bg0 = await bg();
  await page.click('[data-testid="theme"]');
  const theme1 = await until('the theme to switch', () => page.evaluate((t0) => {
    const t = document.documentElement.dataset.theme;
    return t !== t0 && t;
  }, theme0));
  check(theme0 !== theme1 && ['light', 'dark'].includes(theme1), `the theme went from ${theme0} to ${theme1}`);
  check((await bg()) !== bg0, 'the background did not change with the theme');
  await shot(page, `06-theme-${theme1}`);
  await page.reload({ waitUntil: 'load' });
  await until('the theme to survive a reload', () => page.evaluate((t1) => document.documentElement.dataset.theme === t1, theme1), 5000);
  if (theme1 !== 'dark') await page.click('[data-testid="theme"]');

  step = 'phone width';
  await page.setViewport({ width: 390, height: 844, isMobile: true, hasTouch: true });
  await sleep(200);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 0, `the page is ${overflow}px wider than a phone screen`);
  const sidebarShown = () => page.$eval('.sidebar', (e) => e.getBoundingClientRect().right > 1);
  check(!(await sidebarShown()), 'the conversation list covers the chat on a phone');
  await page.click('button[aria-label="Conversations"]');
  await until('the conversation list to open', () => page.$eval('.sidebar', (e) => e.getBoundingClientRect().left === 0));
  await sleep(200);
  await shot(page, '07-phone-list');
  const nConvs = (await storedConversations(page)).length;
  await page.click('button[aria-label="Close the conversation list"]');
  await until('the conversation list to close', async () => !(await sidebarShown()));
  check((await storedConversations(page)).length === nConvs, 'closing the list changed the conversations');
  await shot(page, '07-phone');
  await page.setViewport({ width: 1200, height: 800 });

  step = 'sanitized reply';
  await page.click('.side-actions button.primary');
  await page.evaluate(() => {
    window.__ran = [];
    // Any element that can run or load something, added to the page from here on.
    new MutationObserver((records) => {
      for (const r of records) {
        for (const n of r.addedNodes) {
          if (n.nodeType !== 1) continue;
          for (const el of [n, ...n.querySelectorAll('*')])
            if (/^(SCRIPT|IMG|IFRAME|OBJECT|EMBED|SVG|STYLE|FORM)$/i.test(el.tagName)) window.__ran.push(`added <${el.tagName.toLowerCase()}>`);
        }
      }
    }).observe(document.querySelector('.messages'), { childList: true, subtree: true });
    document.addEventListener('securitypolicyviolation', (e) => window.__ran.push(`csp: ${e.violatedDirective}`));
  });
  const hostile = [
    'Here: <img src=x onerror="window.__ran.push(\'img onerror\')"> and ',
    '<script>window.__ran.push("script")</script>',
    ' and <svg onload="window.__ran.push(\'svg\')"></svg>',
    ' [a link](javascript:window.__ran.push(\'link\')) ',
    '\n\n<iframe src="javascript:parent.__ran.push(\'iframe\')"></iframe>\n\n```html\n<script>alert(1)</script>\n```\n',
  ];
  const sse = hostile.map((t) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: t }, finish_reason: null }] })}\n\n`).join('') +
    `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n` +
    `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 } })}\n\ndata: [DONE]\n\n`;
  await page.setRequestInterception(true);
  const stub = (req) => {
    if (req.method() === 'POST' && req.url().endsWith('/v1/chat/completions'))
      req.respond({ status: 200, contentType: 'text/event-stream', body: sse });
    else req.continue();
  };
  page.on('request', stub);
  await sendMessage(page, 'Say something dangerous.');
  await until('the stub reply', async () => !(await busy(page)) && (await lastReplyText(page)).includes('alert(1)'), 20000);
  page.off('request', stub);
  await page.setRequestInterception(false);
  const links = await page.$$eval('.msg.assistant a', (as) => as.map((a) => a.getAttribute('href')));
  check(links.every((h) => h === null || !/^javascript:/i.test(h)), `a link kept its script: ${JSON.stringify(links)}`);
  for (const a of await page.$$('.msg.assistant a')) await a.click();
  await sleep(300);
  const ran = await page.evaluate(() => window.__ran);
  check(ran.length === 0, `the reply ran or added: ${JSON.stringify(ran)}`);
  const shown = await lastReplyText(page);
  check(shown.includes('<img src=x onerror=') && shown.includes('<script>window.__ran.push("script")</script>'),
    `the HTML is not shown as text: '${shown}'`);
  check((await page.$$('.msg.assistant img, .msg.assistant script, .msg.assistant iframe, .msg.assistant svg')).length === 0,
    'the reply holds an element that can run or load');
  // The Content-Security-Policy is the second wall: an inline script that got into the page
  // anyway does not run.
  const blocked = await page.evaluate(() => new Promise((done) => {
    window.__inline = false;
    document.addEventListener('securitypolicyviolation', () => done(!window.__inline), { once: true });
    const s = document.createElement('script');
    s.textContent = 'window.__inline = true';
    document.body.appendChild(s);
    setTimeout(() => done(false), 2000);
  }));
  check(blocked, 'an injected inline script ran: the page has no working Content-Security-Policy');
  await shot(page, '08-sanitized');
  await page.close();

  step = 'image attach';
  // The attach button shows only for a model that reads images: not for the demo model; with
  // /v1/models stubbed to say "image", a chosen file goes as an image_url part before the text.
  const page3 = watch(await browser.newPage());
  await page3.setViewport({ width: 1200, height: 800 });
  await page3.goto(plain.base, { waitUntil: 'load' });
  await until('the model name', async () => (await page3.$eval('[data-testid="model"]', (e) => e.textContent)) === 'demo');
  check(!(await page3.$('[data-testid="attach"]')), 'a text-only model shows the attach button');
  const plainReply = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'A picture.' }, finish_reason: 'stop' }] })}\n\n` +
    `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 } })}\n\ndata: [DONE]\n\n`;
  let sent = null;
  const vision = (req) => {
    if (req.method() === 'GET' && req.url().endsWith('/v1/models')) {
      req.respond({ status: 200, contentType: 'application/json',
        body: JSON.stringify({ object: 'list', data: [{ id: 'demo', object: 'model', meta: { input_modalities: ['text', 'image'] } }] }) });
    } else if (req.method() === 'POST' && req.url().endsWith('/v1/chat/completions')) {
      sent = JSON.parse(req.postData());
      req.respond({ status: 200, contentType: 'text/event-stream', body: plainReply });
    } else {
      req.continue();
    }
  };
  await page3.setRequestInterception(true);
  page3.on('request', vision);
  await page3.reload({ waitUntil: 'load' });
  await until('the attach button', () => page3.$('[data-testid="attach"]'));
  const png = join(source, 'tests', 'fixtures', 'vision', 'images', 'png_rgb_64x48.png');
  await (await page3.$('[data-testid="attach-input"]')).uploadFile(png);
  await until('the thumbnail', () => page3.$('[data-testid="attached"] img'));
  await shot(page3, '08b-image-attached');
  await sendMessage(page3, 'What is this?');
  await until('the reply to the image', async () => sent !== null && !(await busy(page3)), 20000);
  const lastSent = sent.messages[sent.messages.length - 1];
  const wantUrl = `data:image/png;base64,${readFileSync(png).toString('base64')}`;
  check(Array.isArray(lastSent.content) && lastSent.content.length === 2 && lastSent.content[0].type === 'image_url' &&
    lastSent.content[0].image_url.url === wantUrl && lastSent.content[1].type === 'text' && lastSent.content[1].text === 'What is this?',
    `the message sent with the image: ${JSON.stringify(lastSent).slice(0, 300)}`);
  check(!(await page3.$('[data-testid="attached"]')), 'the attachment stayed after sending');
  check(await page3.$('.msg.user [data-testid="message-images"] img'), 'the sent message shows no image');
  await shot(page3, '08c-image-sent');
  page3.off('request', vision);
  await page3.setRequestInterception(false);
  await page3.close();

  step = 'api key';
  const keyed = await startServer(['--api-key', 'right-key']);
  servers.push(keyed);
  await waitReady(keyed.base);
  const page2 = watch(await browser.newPage());
  await page2.setViewport({ width: 1200, height: 800 });
  const r2 = await page2.goto(keyed.base, { waitUntil: 'load' });
  check(r2.status() === 200, `the page needs the key: GET / answered ${r2.status()}`);
  const keyBanner = await until('the missing-key error', () => page2.$eval('[data-testid="banner"]', (e) => e.textContent).catch(() => ''));
  check(/401/.test(keyBanner) && /API key/.test(keyBanner), `without a key the page says '${keyBanner}'`);
  await openSettings(page2);
  await setField(page2, 'input[name="api-key"]', 'wrong-key');
  await page2.click('button[aria-label="Close settings"]');
  await sendMessage(page2, 'Hello');
  const error = await until('the wrong-key error', () => page2.$eval('.msg.assistant [data-testid="error"]', (e) => e.textContent).catch(() => ''));
  check(/401/.test(error) && /invalid or missing API key/.test(error), `with a wrong key the reply says '${error}'`);
  await shot(page2, '09-wrong-key');
  await openSettings(page2);
  await setField(page2, 'input[name="api-key"]', 'right-key');
  await setField(page2, 'input[name="max_tokens"]', '10');
  await page2.click('button[aria-label="Close settings"]');
  await until('the model name with the right key', async () => (await page2.$eval('[data-testid="model"]', (e) => e.textContent)) === 'demo');
  await page2.click('button[aria-label="Regenerate reply"]');
  await until('a reply with the right key', async () => !(await busy(page2)) && (await lastReplyText(page2)).length > 0, 60000);
  check(!(await page2.$('.msg.assistant [data-testid="error"]')), 'the right key still shows an error');
  await shot(page2, '10-right-key');

  step = 'console';
  check(pageErrors.length === 0, `the page reported errors:\n${pageErrors.join('\n')}`);
}

let code = 0;
try {
  await main();
  console.log(`PASS: every step; screenshots in ${artifacts}`);
} catch (e) {
  console.error(`FAIL ${e.message}`);
  for (const s of servers) console.error(`--- server log (${s.base}) ---\n${s.log().slice(-3000)}`);
  code = 1;
} finally {
  if (browser) await browser.close().catch(() => {});
  for (const s of servers) s.kill('SIGTERM');
  for (const dir of scratch) rmSync(dir, { recursive: true, force: true });
}
process.exit(code);
