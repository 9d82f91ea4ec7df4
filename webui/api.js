// api.js — every request the page makes: relative URLs (so the page works
// behind a path prefix), the API key from localStorage, and the key dialog
// when the server answers 401.

const KEY = 'thaw.apiKey';

export function apiKey() { return localStorage.getItem(KEY) || ''; }
export function forgetKey() { localStorage.removeItem(KEY); }

let asking = null; // one dialog at a time; every caller waits for it

function askKey() {
  if (asking) return asking;
  const dlg = document.getElementById('key-dialog');
  const form = document.getElementById('key-form');
  const input = document.getElementById('key-input');
  asking = new Promise((resolve) => {
    const done = (ev) => {
      ev.preventDefault();
      const k = input.value.trim();
      if (!k) return;
      localStorage.setItem(KEY, k);
      input.value = '';
      form.removeEventListener('submit', done);
      dlg.close();
      asking = null;
      resolve(k);
    };
    form.addEventListener('submit', done);
    dlg.showModal();
    input.focus();
  });
  return asking;
}

// fetch() with the key; on 401 asks for a key and tries again (until a key
// works or the person closes the page).
export async function apiFetch(path, opts = {}) {
  for (;;) {
    const headers = { ...(opts.headers || {}) };
    const k = apiKey();
    if (k) headers.Authorization = 'Bearer ' + k;
    const r = await fetch(path, { ...opts, headers });
    if (r.status !== 401) return r;
    await r.body?.cancel();
    await askKey();
  }
}

// Reads an SSE body: calls onEvent(object) for each `data:` JSON line,
// returns at [DONE] or the end of the body.
export async function readSSE(response, onEvent) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  }
}
