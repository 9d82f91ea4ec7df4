// Drives thaw's POST /v1/completions with the official `openai` npm SDK and
// prints what the SDK parsed, as one JSON line, for test_completions.py.
// usage: node completions_client.mjs BASE_URL API_KEY PROMPT TOKENS_JSON
import OpenAI from "openai";

const [baseURL, apiKey, prompt, tokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const out = { model };

const c = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
out.text = { id: c.id, object: c.object, text: c.choices[0].text, finish_reason: c.choices[0].finish_reason,
             usage: c.usage };
const t = await client.completions.create({ model, prompt: JSON.parse(tokens), max_tokens: 12, temperature: 0 });
out.tokens = { text: t.choices[0].text, usage: t.usage };

const stream = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, stream: true });
let text = "", finish = null, n = 0, usage = null;
for await (const chunk of stream) {
  n++;
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    text += ch.text ?? "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
out.stream = { text, finish_reason: finish, chunks: n, usage };
try {
  await client.completions.create({ model, prompt: ["one", "two"], max_tokens: 2 });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, message: e.message };
}
console.log(JSON.stringify(out));
