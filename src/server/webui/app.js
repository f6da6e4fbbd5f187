// kiln's chat page: talks to this server's /v1/chat/completions (streamed,
// SSE), keeps conversations and settings in localStorage. Model text is only
// ever put into the page as text nodes (textContent), never parsed as HTML.
'use strict';

const $ = (id) => document.getElementById(id);
const CONVS_KEY = 'kiln.webui.conversations';
const SETTINGS_KEY = 'kiln.webui.settings';
const NUMERIC = ['temperature', 'top_p', 'max_tokens', 'seed'];

let convs = [];          // [{id, title, updated, messages: [...]}], newest first
let currentId = null;    // the conversation shown; null: a new one (made on send)
let settings = { system: '', temperature: '', top_p: '', max_tokens: '', seed: '', apiKey: '' };
let modelId = null;      // from /v1/models
let vision = false;      // from /props: the model takes images
let pendingImages = [];  // data URLs attached to the next message
let running = null;      // {controller, msg, el}: the reply being streamed

// ---------------------------------------------------------------- storage

function load() {
  try { convs = JSON.parse(localStorage.getItem(CONVS_KEY) || '[]'); } catch { convs = []; }
  if (!Array.isArray(convs)) convs = [];
  try { Object.assign(settings, JSON.parse(localStorage.getItem(SETTINGS_KEY) || '{}')); } catch { /* defaults */ }
}

function save() {
  try {
    localStorage.setItem(CONVS_KEY, JSON.stringify(convs));
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
  } catch (e) {
    setStatus('cannot save the conversations in this browser (' + e.name + '): delete some, or attach smaller images', true);
  }
}

function current() { return convs.find((c) => c.id === currentId) || null; }

// ---------------------------------------------------------------- rendering

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// A link's address when it is http(s) or mailto (parsed by URL, so that
// "javascript:" or "data:" in any spelling is refused); else null.
function safeHref(url) {
  try {
    const u = new URL(url);
    return ['http:', 'https:', 'mailto:'].includes(u.protocol) ? u.href : null;
  } catch { return null; }
}

// Inline `code`, **bold** and [text](url) links in one line of prose, as
// text nodes and elements made here; a link to another scheme stays text.
function renderInline(parent, line) {
  const re = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\[[^\]\n]+\]\([^)\s]+\))/g;
  let last = 0;
  for (const m of line.matchAll(re)) {
    if (m.index > last) parent.append(line.slice(last, m.index));
    const tok = m[0];
    if (tok[0] === '`') parent.append(el('code', '', tok.slice(1, -1)));
    else if (tok[0] === '*') parent.append(el('strong', '', tok.slice(2, -2)));
    else {
      const k = tok.indexOf('](');
      const href = safeHref(tok.slice(k + 2, -1));
      if (href) {
        const a = el('a', '', tok.slice(1, k));
        a.href = href;
        a.target = '_blank';
        a.rel = 'noopener noreferrer';
        parent.append(a);
      } else {
        parent.append(tok);
      }
    }
    last = m.index + tok.length;
  }
  if (last < line.length) parent.append(line.slice(last));
}

// A table row's cells: | a | b | (the outer pipes optional), \| kept.
function tableCells(line) {
  let t = line.trim();
  if (t.startsWith('|')) t = t.slice(1);
  if (t.endsWith('|') && !t.endsWith('\\|')) t = t.slice(0, -1);
  return t.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
}
const isTableRow = (line) => line.includes('|');
const isTableRule = (line) => /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/.test(line) && line.includes('-');

// A GitHub-style table from lines[i] (header, rule, rows): the table and the
// index after it, or null when lines[i] does not start one.
function renderTable(lines, i) {
  if (i + 1 >= lines.length || !isTableRow(lines[i]) || !isTableRule(lines[i + 1])) return null;
  const head = tableCells(lines[i]);
  const align = tableCells(lines[i + 1]).map((c) => (c.endsWith(':') ? (c.startsWith(':') ? 'center' : 'right') : c.startsWith(':') ? 'left' : ''));
  if (align.length !== head.length) return null;
  const table = el('table');
  const row = (cells, tag) => {
    const tr = el('tr');
    for (let k = 0; k < head.length; k++) {
      const c = el(tag);
      if (align[k]) c.style.textAlign = align[k];
      renderInline(c, cells[k] || '');
      tr.append(c);
    }
    return tr;
  };
  const thead = el('thead');
  thead.append(row(head, 'th'));
  const tbody = el('tbody');
  let j = i + 2;
  for (; j < lines.length && isTableRow(lines[j]); j++) tbody.append(row(tableCells(lines[j]), 'td'));
  table.append(thead, tbody);
  return { table, next: j };
}

// Markdown's fenced code blocks (``` lines), ATX headings (# to ######),
// bullet (-, *, +) and numbered (1. or 1)) lists, tables, inline code, bold
// and links; the
// rest stays text (white-space: pre-wrap keeps its lines). An open fence
// (streaming) runs to the end. Every piece is a text node or an element
// made here: model text is never parsed as HTML.
function renderText(parent, text) {
  parent.replaceChildren();
  const lines = text.split('\n');
  let prose = [];
  const flush = () => {
    if (!prose.length) return;
    renderInline(parent, prose.join('\n'));
    prose = [];
  };
  const item = (line) => /^\s*(?:([-*+])|(\d+)[.)])\s+(.*)$/.exec(line);
  for (let i = 0; i < lines.length; i++) {
    const fence = /^\s*```\s*([\w+#.-]*)\s*$/.exec(lines[i]);
    const head = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(lines[i]);
    const li = item(lines[i]);
    const tab = !fence && !head && !li ? renderTable(lines, i) : null;
    if (!fence && !head && !li && !tab) {
      prose.push(lines[i]);
      continue;
    }
    flush();
    if (tab) {
      parent.append(tab.table);
      i = tab.next - 1;
    } else if (head) {
      const h = el('h' + head[1].length);
      renderInline(h, head[2]);
      parent.append(h);
    } else if (li) { // a run of items of one kind
      const ordered = li[2] !== undefined;
      const list = el(ordered ? 'ol' : 'ul');
      if (ordered && li[2] !== '1') list.start = Number(li[2]);
      let j = i;
      for (let m; j < lines.length && (m = item(lines[j])) && (m[2] !== undefined) === ordered; j++) {
        const e = el('li');
        renderInline(e, m[3]);
        list.append(e);
      }
      parent.append(list);
      i = j - 1;
    } else {
      const code = [];
      let j = i + 1;
      while (j < lines.length && !/^\s*```\s*$/.test(lines[j])) code.push(lines[j++]);
      const pre = el('pre');
      const c = el('code', '', code.join('\n'));
      if (fence[1]) c.dataset.lang = fence[1];
      pre.append(c);
      parent.append(pre);
      i = j; // the closing fence (or the end)
    }
    if (i + 1 < lines.length && lines[i + 1] === '') i++; // the newline after the block
  }
  flush();
}

function formatStats(s) {
  if (!s) return '';
  const parts = [s.tokens + (s.tokens === 1 ? ' token' : ' tokens')];
  if (s.tps !== null && isFinite(s.tps)) parts.push(s.tps.toFixed(1) + ' tokens/s');
  if (s.ttft !== null) parts.push('first token ' + s.ttft.toFixed(2) + ' s');
  if (s.finish === 'length') parts.push('stopped at max_tokens');
  else if (s.finish && s.finish !== 'stop') parts.push('finish: ' + s.finish);
  return parts.join(' · ');
}

function messageElement(m) {
  const e = el('div', 'msg ' + m.role);
  if (m.role === 'error') {
    e.setAttribute('role', 'alert');
    e.append(el('div', 'role', 'error'), el('div', 'content', m.content));
    return e;
  }
  e.append(el('div', 'role', m.role));
  if (m.role === 'assistant') {
    const d = el('details', 'reasoning');
    d.append(el('summary', '', 'Reasoning'), el('div', 'reasoning-text'));
    e.append(d);
  }
  e.append(el('div', 'content'));
  if (m.role === 'assistant') e.append(el('div', 'tools'), el('div', 'stats'));
  if (m.images && m.images.length) {
    const box = el('div', 'images');
    for (const url of m.images) {
      const img = el('img');
      img.alt = 'attached image';
      img.src = url; // a data: URL the user attached
      box.append(img);
    }
    e.append(box);
  }
  updateElement(e, m);
  return e;
}

// Refreshes a message's element from the message (called per streamed chunk).
function updateElement(e, m) {
  if (m.role !== 'assistant') {
    e.querySelector('.content').textContent = m.content;
    return;
  }
  e.dataset.state = m.state || 'done';
  const d = e.querySelector('.reasoning');
  d.hidden = !m.reasoning;
  e.querySelector('.reasoning-text').textContent = m.reasoning || '';
  renderText(e.querySelector('.content'), m.content || '');
  const tools = e.querySelector('.tools');
  tools.replaceChildren();
  for (const t of m.toolCalls || []) {
    tools.append(el('div', '', 'tool call: ' + (t.name || '?')), el('pre', '', t.arguments || ''));
  }
  let stats = formatStats(m.stats);
  if (m.state === 'stopped') stats = (stats ? stats + ' · ' : '') + 'stopped';
  e.querySelector('.stats').textContent = stats;
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  const c = current();
  for (const m of c ? c.messages : []) {
    const e = messageElement(m);
    if (running && running.msg === m) running.el = e;
    box.append(e);
  }
  box.scrollTop = box.scrollHeight;
}

function renderList() {
  const ul = $('conversations');
  ul.replaceChildren();
  for (const c of convs) {
    const li = el('li');
    li.dataset.id = c.id;
    if (c.id === currentId) li.className = 'current';
    const open = el('button', 'open', c.title || 'New chat');
    open.type = 'button';
    open.title = c.title || '';
    open.addEventListener('click', () => { currentId = c.id; renderAll(); });
    const del = el('button', 'delete', '×');
    del.type = 'button';
    del.title = 'Delete this conversation';
    del.setAttribute('aria-label', 'Delete ' + (c.title || 'conversation'));
    del.addEventListener('click', () => deleteConv(c.id));
    li.append(open, del);
    ul.append(li);
  }
}

function renderAll() { renderList(); renderMessages(); }

function setStatus(text, bad) {
  const s = $('status');
  s.textContent = text;
  s.classList.toggle('bad', !!bad);
}

function setRunning(on) {
  $('send').disabled = on;
  $('stop').hidden = !on;
}

// ---------------------------------------------------------------- conversations

function deleteConv(id) {
  if (running && running.conv.id === id) running.controller.abort();
  convs = convs.filter((c) => c.id !== id);
  if (currentId === id) currentId = convs.length ? convs[0].id : null;
  save();
  renderAll();
}

function newConv() {
  currentId = null;
  renderAll();
  $('input').focus();
}

// ---------------------------------------------------------------- the API

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (settings.apiKey) h.Authorization = 'Bearer ' + settings.apiKey;
  return h;
}

// The message of an error reply (OpenAI's {"error": {...}} or any text).
async function errorText(resp) {
  const text = await resp.text();
  let msg = text;
  try {
    const j = JSON.parse(text);
    if (j && j.error) msg = typeof j.error === 'string' ? j.error : j.error.message || JSON.stringify(j.error);
  } catch { /* not JSON */ }
  let hint = '';
  if (resp.status === 401) hint = ' (set the API key in Settings)';
  return 'HTTP ' + resp.status + ': ' + msg + hint;
}

// The data of each server-sent event of a streamed response.
async function* events(resp) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = ev.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data) yield data;
    }
  }
}

function requestMessages(c) {
  const out = [];
  if (settings.system.trim()) out.push({ role: 'system', content: settings.system });
  for (const m of c.messages) {
    if (m.role === 'user') {
      if (m.images && m.images.length) {
        const parts = [];
        if (m.content) parts.push({ type: 'text', text: m.content });
        for (const url of m.images) parts.push({ type: 'image_url', image_url: { url } });
        out.push({ role: 'user', content: parts });
      } else {
        out.push({ role: 'user', content: m.content });
      }
    } else if (m.role === 'assistant' && m.content) {
      out.push({ role: 'assistant', content: m.content });
    }
  }
  return out;
}

// The sampling settings given (empty fields: the server's defaults).
function sampling() {
  const out = {};
  for (const k of NUMERIC) {
    const v = String(settings[k]).trim();
    if (v !== '') out[k] = Number(v);
  }
  return out;
}

async function send() {
  const text = $('input').value;
  if (running || (!text.trim() && !pendingImages.length)) return;
  let c = current();
  if (!c) {
    c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: '', messages: [] };
    convs.unshift(c);
    currentId = c.id;
  }
  if (!c.title) c.title = (text.trim() || 'image').slice(0, 60);
  c.messages.push({ role: 'user', content: text, images: pendingImages });
  const body = Object.assign({ messages: requestMessages(c), stream: true, stream_options: { include_usage: true } }, sampling());
  if (modelId) body.model = modelId;
  const msg = { role: 'assistant', content: '', reasoning: '', state: 'streaming', stats: null };
  c.messages.push(msg);
  c.updated = Date.now();
  convs = [c].concat(convs.filter((x) => x !== c)); // the newest first
  pendingImages = [];
  $('input').value = '';
  renderAttachments();
  running = { controller: new AbortController(), msg, el: null, conv: c };
  renderAll();
  setRunning(true);
  const t0 = performance.now();
  let tFirst = null, chunks = 0, usage = null, finish = null, error = null;
  const stats = () => {
    const now = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    // the decoding rate: tokens after the first over the time since it came
    const tps = tFirst !== null && tokens > 1 && now > tFirst ? ((tokens - 1) * 1000) / (now - tFirst) : null;
    return { tokens, tps, ttft: tFirst !== null ? (tFirst - t0) / 1000 : null, finish };
  };
  try {
    const resp = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(body), signal: running.controller.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    let last = 0;
    for await (const data of events(resp)) {
      if (data === '[DONE]') break;
      let j;
      try { j = JSON.parse(data); } catch { throw new Error('the server sent an event that is not JSON: ' + data.slice(0, 200)); }
      if (j.error) throw new Error('the server ended the reply: ' + (j.error.message || JSON.stringify(j.error)));
      if (j.usage) usage = j.usage;
      for (const ch of j.choices || []) {
        const d = ch.delta || {};
        if (d.content) msg.content += d.content;
        if (d.reasoning_content) msg.reasoning += d.reasoning_content;
        for (const t of d.tool_calls || []) {
          msg.toolCalls = msg.toolCalls || [];
          const k = t.index || 0;
          const call = msg.toolCalls[k] || (msg.toolCalls[k] = { name: '', arguments: '' });
          if (t.function && t.function.name) call.name += t.function.name;
          if (t.function && t.function.arguments) call.arguments += t.function.arguments;
        }
        if (d.content || d.reasoning_content || d.tool_calls) {
          if (tFirst === null) tFirst = performance.now();
          chunks++;
        }
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      msg.stats = stats();
      if (running.el) updateElement(running.el, msg);
      const now = performance.now();
      if (now - last > 1000) { save(); last = now; } // a reload mid-reply keeps most of it
      const box = $('messages');
      if (box.scrollHeight - box.scrollTop - box.clientHeight < 80) box.scrollTop = box.scrollHeight;
    }
    msg.state = 'done';
  } catch (e) {
    if (e.name === 'AbortError') {
      msg.state = 'stopped';
    } else {
      msg.state = 'done';
      error = e.message || String(e);
    }
  }
  msg.stats = stats();
  if (error) {
    if (!msg.content && !msg.reasoning) c.messages.pop(); // nothing came: only the error stays
    c.messages.push({ role: 'error', content: error });
  }
  const shown = running.conv.id === currentId;
  running = null;
  setRunning(false);
  save();
  if (shown) renderMessages();
}

// ---------------------------------------------------------------- images

function renderAttachments() {
  const box = $('attachments');
  box.replaceChildren();
  pendingImages.forEach((url, i) => {
    const f = el('figure');
    const img = el('img');
    img.alt = 'image to send';
    img.src = url;
    const rm = el('button', '', '×');
    rm.type = 'button';
    rm.title = 'Remove';
    rm.addEventListener('click', () => { pendingImages.splice(i, 1); renderAttachments(); });
    f.append(img, rm);
    box.append(f);
  });
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

// ---------------------------------------------------------------- the server

async function connect() {
  // /health answers without a key; 503 while the model loads
  for (;;) {
    try {
      const h = await fetch('/health');
      if (h.ok) break;
      setStatus(await errorText(h), h.status !== 503);
    } catch (e) {
      setStatus('cannot reach the server: ' + e.message, true);
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const j = await r.json();
    const m = j.data && j.data[0];
    if (m) {
      modelId = m.id;
      $('model').textContent = m.id;
      document.title = m.id + ' · kiln chat';
    }
    const p = await fetch('/props', { headers: headers() });
    if (p.ok) {
      const pj = await p.json();
      vision = !!(pj.modalities && pj.modalities.vision);
    }
    $('attach').hidden = !vision;
    setStatus(m && m.max_model_len ? 'ready · context ' + m.max_model_len + ' tokens' : 'ready');
  } catch (e) {
    setStatus(e.message, true);
  }
}

// ---------------------------------------------------------------- wiring

function init() {
  load();
  if (convs.length) currentId = convs[0].id;
  for (const k of NUMERIC.concat(['system'])) {
    $(k).value = settings[k] || '';
    $(k).addEventListener('input', () => { settings[k] = $(k).value; save(); });
  }
  $('api-key').value = settings.apiKey || '';
  $('api-key').addEventListener('change', () => { settings.apiKey = $('api-key').value; save(); connect(); });
  $('settings-toggle').addEventListener('click', () => {
    const s = $('settings');
    s.hidden = !s.hidden;
    $('settings-toggle').setAttribute('aria-expanded', String(!s.hidden));
  });
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', () => { if (running) running.controller.abort(); });
  $('new-chat').addEventListener('click', newConv);
  $('attach').addEventListener('click', () => $('image-file').click());
  $('image-file').addEventListener('change', async () => {
    const files = Array.from($('image-file').files);
    $('image-file').value = '';
    try {
      for (const f of files) pendingImages.push(await readImage(f));
    } catch (e) {
      setStatus('cannot read the image: ' + e.message, true);
    }
    renderAttachments();
  });
  renderAll();
  connect();
}

init();
