// Drives a thaw server with the official `openai` npm SDK and prints what
// the SDK parsed, as one JSON line, for test_openai_sdk.py to check.
// usage: node openai_client.mjs BASE_URL API_KEY
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const messages = [
  { role: "system", content: "You are a terse assistant." },
  { role: "user", content: "Tell me about the sea and the sky." },
];
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const c = await client.chat.completions.create({ model: out.models[0], messages, max_tokens: 12, temperature: 0 });
out.completion = {
  id: c.id, object: c.object, content: c.choices[0].message.content, role: c.choices[0].message.role,
  finish_reason: c.choices[0].finish_reason, usage: c.usage,
};

const stream = await client.chat.completions.create({
  model: out.models[0], messages, max_tokens: 12, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let text = "", finish = null, usage = null, n = 0;
for await (const chunk of stream) {
  n++;
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    text += ch.delta?.content ?? "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
out.stream = { content: text, finish_reason: finish, usage, chunks: n };

try {
  await client.chat.completions.create({ model: out.models[0], messages: [] });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, message: e.message, type: e.type };
}
try {
  await new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 }).models.list();
  out.auth = null;
} catch (e) {
  out.auth = { status: e.status };
}
console.log(JSON.stringify(out));
