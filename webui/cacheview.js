// cacheview.js — the cache at work: GET /cache (the numbers /metrics
// renders) every few seconds while the tab is open, as tiles and two uPlot
// charts (lookups served by tier, bytes held against their budgets).
import uPlot from './vendor/uPlot.js';
import { apiFetch } from './api.js';

const POLL_MS = 2000;
const KEEP = 300; // samples kept: 10 minutes at POLL_MS
const TIERS = ['slot', 'ram', 'disk', 'blocks', 'shared'];
const COLORS = { slot: '#9333ea', ram: '#0284c7', disk: '#16a34a', blocks: '#ca8a04', shared: '#ea580c', miss: '#9ca3af' };

const $ = (id) => document.getElementById(id);
const hist = { t: [], hits: Object.fromEntries([...TIERS, 'miss'].map((k) => [k, []])), disk: [], ram: [], queue: [] };
let timer = null, hitsPlot = null, bytesPlot = null;

function bytes(n) {
  if (n == null) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + ' ' + u[i];
}
const num = (n) => (n == null ? '–' : Number(n).toLocaleString('en-US'));

function tile(id, key, value, sub) {
  let el = $(id);
  if (!el) {
    el = document.createElement('div');
    el.className = 'tile';
    el.id = id;
    el.append(Object.assign(document.createElement('div'), { className: 'k' }),
      Object.assign(document.createElement('div'), { className: 'v' }),
      Object.assign(document.createElement('div'), { className: 's' }));
    $('tiles').append(el);
  }
  el.children[0].textContent = key;
  el.children[1].textContent = value;
  el.children[2].textContent = sub || '';
}

function tiles(m) {
  const lookups = m.kv_cache_lookups_total || 0;
  const hits = TIERS.reduce((a, k) => a + (m[`kv_cache_hits_${k}_total`] || 0), 0);
  tile('tile-lookups', 'lookups', num(lookups), `${num(hits)} restored or reused, ${num(m.kv_cache_misses_total)} prefilled`);
  for (const k of TIERS) tile(`tile-hits-${k}`, `hits: ${k}`, num(m[`kv_cache_hits_${k}_total`] || 0));
  tile('tile-misses', 'misses', num(m.kv_cache_misses_total || 0));
  const restores = (m.kv_cache_hits_ram_total || 0) + (m.kv_cache_hits_disk_total || 0) + (m.kv_cache_hits_shared_total || 0) + (m.kv_cache_hits_blocks_total || 0);
  tile('tile-restore', 'restore time', restores ? `${((m.kv_cache_restore_seconds_total || 0) * 1000 / restores).toFixed(1)} ms` : '–',
    `mean of ${num(restores)} restores`);
  const rate = m.prompt_tokens_total > 0 ? (m.prompt_seconds_total * 1000) / m.prompt_tokens_total : null;
  tile('tile-prefill', 'prefill rate', rate ? `${rate.toFixed(2)} ms/tok` : '–',
    `${num(m.prompt_tokens_total)} tokens prefilled, ${num(m.prompt_cached_tokens_total)} from cache`);
  if (m.kv_disk_bytes != null) {
    const budget = m.kv_disk_budget_bytes;
    tile('tile-disk', 'disk', bytes(m.kv_disk_bytes), `${num(m.kv_disk_entries)} files, budget ${budget ? bytes(budget) : 'none'}`);
    const w = m.kv_disk_blocks_written_total || 0, s = m.kv_disk_blocks_skipped_total || 0;
    tile('tile-blocks', 'blocks written', num(w), `${num(s)} skipped (already on disk): dedup ${w + s ? ((100 * s) / (w + s)).toFixed(0) : 0}%`);
    tile('tile-stores', 'conversations stored', num(m.kv_disk_stores_total), `${num(m.kv_disk_store_failures_total)} failed`);
    tile('tile-queue', 'store queue', bytes(m.kv_disk_queue_bytes),
      `${num((m.kv_disk_stores_dropped_total || 0) + (m.kv_disk_blocks_dropped_total || 0))} dropped`);
  } else {
    tile('tile-disk', 'disk', 'off', 'no --kv-cache-dir');
  }
  tile('tile-ram', 'RAM tier', m.kv_cache_ram_budget_bytes ? bytes(m.kv_cache_ram_bytes) : 'off',
    m.kv_cache_ram_budget_bytes ? `${num(m.kv_cache_ram_entries)} conversations, budget ${bytes(m.kv_cache_ram_budget_bytes)}` : '--cache-ram 0');
  if (m.kv_shared_breaker_open != null) {
    tile('tile-shared', 'shared tier', m.kv_shared_breaker_open ? 'breaker open' : 'healthy',
      `${num(m.kv_shared_uploads_total)} uploads, ${num(m.kv_shared_upload_queue)} queued, ${num(m.kv_shared_fetch_errors_total)} fetch errors`);
  } else {
    tile('tile-shared', 'shared tier', 'off', 'no --kv-shared');
  }
}

function plots() {
  const width = Math.max(320, $('chart-hits').clientWidth - 12);
  const hitsSeries = [{}, ...TIERS.map((k) => ({ label: k, stroke: COLORS[k], width: 2 })), { label: 'miss', stroke: COLORS.miss, width: 2, dash: [4, 4] }];
  hitsPlot = new uPlot({ width, height: 180, series: hitsSeries, scales: { y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } } },
    [hist.t, ...TIERS.map((k) => hist.hits[k]), hist.hits.miss], $('chart-hits'));
  bytesPlot = new uPlot({
    width, height: 180,
    series: [{}, { label: 'disk', stroke: COLORS.disk, width: 2 }, { label: 'RAM', stroke: COLORS.ram, width: 2 },
      { label: 'store queue', stroke: COLORS.shared, width: 2 }],
    axes: [{}, { values: (u, vals) => vals.map(bytes), size: 80 }],
  }, [hist.t, hist.disk, hist.ram, hist.queue], $('chart-bytes'));
}

async function poll() {
  try {
    const r = await apiFetch('cache');
    if (!r.ok) throw new Error(`GET /cache: ${r.status}`);
    const m = (await r.json()).metrics;
    $('cache-error').hidden = true;
    hist.t.push(Date.now() / 1000);
    for (const k of TIERS) hist.hits[k].push(m[`kv_cache_hits_${k}_total`] || 0);
    hist.hits.miss.push(m.kv_cache_misses_total || 0);
    hist.disk.push(m.kv_disk_bytes || 0);
    hist.ram.push(m.kv_cache_ram_bytes || 0);
    hist.queue.push(m.kv_disk_queue_bytes || 0);
    if (hist.t.length > KEEP) {
      for (const a of [hist.t, hist.disk, hist.ram, hist.queue, ...Object.values(hist.hits)]) a.shift();
    }
    tiles(m);
    if (!hitsPlot) plots();
    hitsPlot.setData([hist.t, ...TIERS.map((k) => hist.hits[k]), hist.hits.miss]);
    bytesPlot.setData([hist.t, hist.disk, hist.ram, hist.queue]);
    document.body.dataset.cachePolls = String(Number(document.body.dataset.cachePolls || 0) + 1);
  } catch (e) {
    $('cache-error').hidden = false;
    $('cache-error').textContent = String(e.message || e);
  }
}

export function showCache(on) {
  clearInterval(timer);
  timer = null;
  if (!on) return;
  $('poll-s').textContent = String(POLL_MS / 1000);
  poll();
  timer = setInterval(poll, POLL_MS);
}
