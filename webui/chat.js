// chat.js — conversations (kept in localStorage), streaming replies, and
// under each reply where its prompt came from and what that saved.
import { marked } from './vendor/marked.js';
import DOMPurify from './vendor/purify.js';
import hljs from './vendor/highlight.js';
import { apiFetch, readSSE, forgetKey } from './api.js';

const STORE = 'thaw.conversations';
const CURRENT = 'thaw.current';
const SETTINGS = 'thaw.settings';

const $ = (id) => document.getElementById(id);
let convs = load(STORE, []);
let current = localStorage.getItem(CURRENT);
let settings = { temperature: 0.7, max_tokens: 512, system: '', ...load(SETTINGS, {}) };
let inflight = null; // { controller, conv, msg } while a reply streams

function load(key, dflt) {
  try { return JSON.parse(localStorage.getItem(key)) ?? dflt; } catch { return dflt; }
}
function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(convs));
  } catch (e) { // images can outgrow the browser's storage: the page goes on, unsaved
    $('status').textContent = 'not saved in this browser: ' + e.name;
  }
  if (current) localStorage.setItem(CURRENT, current);
}
function conv() { return convs.find((c) => c.id === current); }
// crypto.randomUUID exists only in secure contexts (https, localhost); a
// page opened as http://host:8080/ from another machine has getRandomValues.
function newId() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}
function newConv() {
  const c = { id: newId(), title: 'New chat', messages: [], updated: Date.now() };
  convs.unshift(c);
  current = c.id;
  save();
  return c;
}

// ---- rendering -------------------------------------------------------------

function markdown(text) {
  return DOMPurify.sanitize(marked.parse(text || '', { gfm: true, breaks: false }));
}

function fmtMs(ms) {
  if (ms == null || !isFinite(ms)) return '?';
  return ms >= 1000 ? (ms / 1000).toFixed(2) + ' s' : ms >= 100 ? ms.toFixed(0) + ' ms' : ms.toFixed(1) + ' ms';
}

// The line under a reply, from its timings (llama-server's object plus
// thaw's restore_ms), thaw's cache_source (beside the timings in a reply;
// inside them in conversations saved before) and usage.
export function statsParts(st) {
  const t = st.timings || {};
  const u = st.usage || {};
  const parts = [];
  const promptTotal = u.prompt_tokens ?? ((t.prompt_n || 0) + (t.cache_n || 0));
  parts.push(['', `prompt ${promptTotal} tok`]);
  const src = st.cache_source || t.cache_source || 'none';
  if ((t.cache_n || 0) > 0 && src !== 'none') {
    parts.push(['', `cached ${t.cache_n} from `, ['src ' + src, src]]);
  } else {
    parts.push(['', 'no cache hit']);
  }
  if (t.restore_ms > 0) parts.push(['restore', `restore ${fmtMs(t.restore_ms)}`]);
  parts.push(['', `prefill ${t.prompt_n ?? '?'} tok in ${fmtMs(t.prompt_ms)}`]);
  if (t.predicted_n > 0 && t.predicted_ms > 0) {
    parts.push(['', `gen ${t.predicted_n} tok, ${(t.predicted_n * 1000 / t.predicted_ms).toFixed(1)} tok/s`]);
  }
  if ((t.cache_n || 0) > 0 && st.rate_ms > 0) {
    const saved = t.cache_n * st.rate_ms - (t.restore_ms || 0);
    parts.push(['saved', `saved ≈ ${fmtMs(Math.max(0, saved))} of prefill (${t.cache_n} tok × ${st.rate_ms.toFixed(2)} ms/tok${t.restore_ms > 0 ? ' − restore' : ''})`]);
  }
  return parts;
}

function renderStats(el, st) {
  el.replaceChildren();
  for (const [cls, text, badge] of statsParts(st)) {
    const s = document.createElement('span');
    if (cls) s.className = cls;
    s.append(text);
    if (badge) {
      const b = document.createElement('span');
      b.className = badge[0];
      b.textContent = badge[1];
      s.append(b);
    }
    el.append(s);
  }
}

function renderMessage(m, el) {
  el.className = 'msg ' + m.role;
  el.replaceChildren();
  const role = document.createElement('div');
  role.className = 'role';
  role.textContent = m.role === 'user' ? 'You' : 'Assistant';
  el.append(role);
  if (m.role === 'user') {
    const c = document.createElement('div');
    c.className = 'content';
    c.textContent = m.content;
    el.append(c);
    for (const u of m.images || []) {
      const img = document.createElement('img');
      img.className = 'image';
      img.alt = 'attached image';
      img.src = u;
      el.append(img);
    }
    return;
  }
  if (m.reasoning) {
    const d = document.createElement('details');
    d.className = 'reasoning';
    const s = document.createElement('summary');
    s.textContent = 'Reasoning';
    d.append(s, m.reasoning);
    el.append(d);
  }
  const c = document.createElement('div');
  c.className = 'content';
  c.innerHTML = markdown(m.content);
  // highlight.js escapes what it colours: the sanitized text stays text
  for (const code of c.querySelectorAll('pre code')) hljs.highlightElement(code);
  el.append(c);
  for (const tc of m.tool_calls || []) {
    const d = document.createElement('div');
    d.className = 'tool-call';
    const name = document.createElement('b');
    name.textContent = 'tool call: ' + (tc.function?.name || '?');
    const args = document.createElement('pre');
    args.textContent = tc.function?.arguments || '';
    d.append(name, args);
    el.append(d);
  }
  if (m.error) {
    const e = document.createElement('div');
    e.className = 'error';
    e.textContent = m.error;
    el.append(e);
  }
  if (m.stats) {
    const s = document.createElement('div');
    s.className = 'stats';
    renderStats(s, m.stats);
    el.append(s);
  }
}

function renderList() {
  const ul = $('conversations');
  ul.replaceChildren();
  for (const c of convs) {
    const li = document.createElement('li');
    if (c.id === current) li.className = 'current';
    const t = document.createElement('span');
    t.textContent = c.title;
    const del = document.createElement('button');
    del.type = 'button';
    del.title = 'Delete';
    del.textContent = '×';
    del.addEventListener('click', (ev) => {
      ev.stopPropagation();
      convs = convs.filter((x) => x.id !== c.id);
      if (current === c.id) current = convs[0]?.id || null;
      save();
      render();
    });
    li.append(t, del);
    li.addEventListener('click', () => { if (!inflight) { current = c.id; save(); render(); } });
    ul.append(li);
  }
}

function render() {
  renderList();
  const box = $('messages');
  box.replaceChildren();
  const c = conv();
  for (const m of c ? c.messages : []) {
    const el = document.createElement('div');
    renderMessage(m, el);
    box.append(el);
  }
  box.scrollTop = box.scrollHeight;
  const busy = !!inflight;
  $('send').disabled = busy;
  $('stop').disabled = !busy;
  const last = c?.messages.at(-1);
  $('regenerate').disabled = busy || !last || last.role !== 'assistant';
  $('edit-last').disabled = busy || !c?.messages.some((m) => m.role === 'user');
}

// ---- sending ---------------------------------------------------------------

// The history as the API takes it: what each reply said, as the server sent
// it (so the server's cache key for the conversation matches the next turn).
function apiMessages(c) {
  const out = [];
  if (settings.system) out.push({ role: 'system', content: settings.system });
  for (const m of c.messages) {
    if (m.role === 'assistant' && m.error && !m.content) continue;
    const x = { role: m.role, content: m.content };
    // images as chat completions' parts, after the text (data: URLs)
    if (m.images?.length) {
      x.content = [{ type: 'text', text: m.content },
        ...m.images.map((u) => ({ type: 'image_url', image_url: { url: u } }))];
    }
    if (m.tool_calls?.length) x.tool_calls = m.tool_calls;
    out.push(x);
  }
  return out;
}

// The server's measured prefill rate (ms per token), for the "saved"
// estimate: /metrics' prefill time over prefilled tokens once the server has
// prefilled enough to tell, else the last long prefill this page saw on this
// origin (a restarted server has measured only the few tokens it prefilled
// since, slow first calls included), else none.
const RATE = 'thaw.prefillRate';
const RATE_MIN_TOKENS = 128;

async function prefillRate(t) {
  if (t.prompt_n >= RATE_MIN_TOKENS && t.prompt_ms > 0) localStorage.setItem(RATE, String(t.prompt_ms / t.prompt_n));
  try {
    const r = await apiFetch('cache');
    if (r.ok) {
      const m = (await r.json()).metrics;
      if (m.prompt_tokens_total >= RATE_MIN_TOKENS) return (m.prompt_seconds_total * 1000) / m.prompt_tokens_total;
    }
  } catch { /* the page's own measurement below */ }
  return Number(localStorage.getItem(RATE)) || 0;
}

async function complete(c) {
  const msg = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
  c.messages.push(msg);
  const controller = new AbortController();
  inflight = { controller, conv: c, msg };
  render();
  const el = $('messages').lastElementChild;
  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      renderMessage(msg, el);
      $('messages').scrollTop = $('messages').scrollHeight;
    });
  };
  $('status').textContent = 'waiting for the server…';
  const body = {
    // the history without the placeholder this reply streams into
    messages: apiMessages({ messages: c.messages.slice(0, -1) }),
    stream: true,
    stream_options: { include_usage: true },
  };
  // an empty or nonsense setting is left to the server's default
  const temp = parseFloat(settings.temperature), max = parseInt(settings.max_tokens, 10);
  if (isFinite(temp) && temp >= 0) body.temperature = temp;
  if (max > 0) body.max_tokens = max;
  let timings = null, usage = null, cacheSource = null;
  try {
    const r = await apiFetch('v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!r.ok) {
      let text = `${r.status} ${r.statusText}`;
      try { text = (await r.json()).error?.message || text; } catch { /* not JSON */ }
      throw new Error(text);
    }
    $('status').textContent = 'streaming…';
    await readSSE(r, (ev) => {
      if (ev.error) throw new Error(ev.error.message || 'error');
      if (ev.usage) usage = ev.usage;
      const ch = ev.choices?.[0];
      if (!ch) return;
      const d = ch.delta || {};
      if (d.content) msg.content += d.content;
      if (d.reasoning_content) msg.reasoning += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        const i = tc.index ?? 0;
        const cur = msg.tool_calls[i] ||= { id: '', type: 'function', function: { name: '', arguments: '' } };
        if (tc.id) cur.id = tc.id;
        if (tc.function?.name) cur.function.name += tc.function.name;
        if (tc.function?.arguments) cur.function.arguments += tc.function.arguments;
      }
      if (ev.timings) timings = ev.timings;
      if (ev.cache_source) cacheSource = ev.cache_source;
      redraw();
    });
    $('status').textContent = '';
  } catch (e) {
    if (e.name === 'AbortError') {
      $('status').textContent = 'stopped';
    } else {
      msg.error = String(e.message || e);
      $('status').textContent = '';
    }
  }
  if (!msg.reasoning) delete msg.reasoning;
  if (!msg.tool_calls.length) delete msg.tool_calls;
  if (timings) msg.stats = { timings, usage, cache_source: cacheSource, rate_ms: await prefillRate(timings) };
  c.updated = Date.now();
  inflight = null;
  save();
  render();
}

// The images attached to the next message, as data: URLs.
let pending = [];

function showAttached() {
  const el = $('attached');
  el.replaceChildren();
  pending.forEach((u, i) => {
    const img = document.createElement('img');
    img.className = 'thumb';
    img.alt = 'attached image';
    img.title = 'Click to remove';
    img.src = u;
    img.addEventListener('click', () => { pending.splice(i, 1); showAttached(); });
    el.append(img);
  });
}

function attach(files) {
  for (const f of files) {
    if (!f.type.startsWith('image/')) continue;
    const r = new FileReader();
    r.onload = () => { pending.push(r.result); showAttached(); };
    r.readAsDataURL(f);
  }
}

async function send(text) {
  const c = conv() || newConv();
  if (c.messages.length === 0) c.title = (text || '(image)').slice(0, 40);
  const m = { role: 'user', content: text };
  if (pending.length) m.images = pending;
  pending = [];
  showAttached();
  c.messages.push(m);
  save();
  await complete(c);
}

// ---- wiring ------------------------------------------------------------------

export function initChat() {
  marked.use({ async: false });
  if (!conv()) current = convs[0]?.id || null;
  $('set-temperature').value = settings.temperature;
  $('set-max-tokens').value = settings.max_tokens;
  $('set-system').value = settings.system;
  for (const [id, key] of [['set-temperature', 'temperature'], ['set-max-tokens', 'max_tokens'], ['set-system', 'system']]) {
    $(id).addEventListener('change', () => {
      settings[key] = $(id).value;
      localStorage.setItem(SETTINGS, JSON.stringify(settings));
    });
  }
  $('settings-toggle').addEventListener('click', () => { $('settings').hidden = !$('settings').hidden; });
  $('forget-key').addEventListener('click', () => { forgetKey(); $('status').textContent = 'API key forgotten'; });
  $('new-chat').addEventListener('click', () => { if (!inflight) { newConv(); render(); $('input').focus(); } });
  $('composer').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = $('input').value.trim();
    if ((!text && !pending.length) || inflight) return;
    $('input').value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('composer').requestSubmit(); }
  });
  $('stop').addEventListener('click', () => inflight?.controller.abort());
  $('attach').addEventListener('click', () => $('attach-file').click());
  $('attach-file').addEventListener('change', (ev) => { attach(ev.target.files); ev.target.value = ''; });
  $('input').addEventListener('paste', (ev) => {
    const files = [...(ev.clipboardData?.files || [])].filter((f) => f.type.startsWith('image/'));
    if (!files.length) return;
    ev.preventDefault();
    attach(files);
  });
  $('regenerate').addEventListener('click', () => {
    const c = conv();
    if (inflight || !c || c.messages.at(-1)?.role !== 'assistant') return;
    c.messages.pop();
    complete(c);
  });
  $('edit-last').addEventListener('click', () => {
    const c = conv();
    if (inflight || !c) return;
    let i = c.messages.length - 1;
    while (i >= 0 && c.messages[i].role !== 'user') i--;
    if (i < 0) return;
    $('input').value = c.messages[i].content;
    pending = c.messages[i].images || [];
    showAttached();
    c.messages.splice(i); // the message and its reply: sending again replaces them
    save();
    render();
    $('input').focus();
  });
  render();
}
