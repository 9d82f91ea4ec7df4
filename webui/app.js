// app.js — the page's entry module: the two tabs (#chat, #cache) and the
// model's name in the header.
import { initChat } from './chat.js';
import { showCache } from './cacheview.js';
import { apiFetch } from './api.js';

const $ = (id) => document.getElementById(id);

function route() {
  const cache = location.hash === '#cache';
  $('view-chat').hidden = cache;
  $('view-cache').hidden = !cache;
  $('tab-chat').classList.toggle('active', !cache);
  $('tab-cache').classList.toggle('active', cache);
  showCache(cache);
}

async function model() {
  try {
    const r = await apiFetch('v1/models');
    if (r.ok) $('model').textContent = (await r.json()).data?.[0]?.id || '';
  } catch { /* the header stays empty; the chat says what went wrong */ }
}

initChat();
window.addEventListener('hashchange', route);
route();
model();
document.body.dataset.ready = '1';
