// Drives a thaw server with the official `@anthropic-ai/sdk` and prints
// what the SDK parsed, as one JSON line, for test_anthropic.py to check.
// usage: node anthropic_client.mjs BASE_URL API_KEY
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
const model = "thaw";
const system = [{ type: "text", text: "You are a terse assistant.", cache_control: { type: "ephemeral" } }];
const weather = {
  name: "get_weather", description: "Current weather of a city",
  input_schema: { type: "object", properties: { city: { type: "string", enum: ["Paris", "London"] } }, required: ["city"] },
};
const time = {
  name: "get_time", description: "Local time in a timezone",
  input_schema: { type: "object", properties: { tz: { type: "string", enum: ["UTC", "CET"] } }, required: ["tz"] },
};
const out = {};
const strip = (m) => ({ content: m.content, stop_reason: m.stop_reason, role: m.role, type: m.type, usage: m.usage });

// plain text, both ways
const ask = { model, system, max_tokens: 24, temperature: 0,
  messages: [{ role: "user", content: "Tell me about the sea and the sky." }] };
out.plain = strip(await client.messages.create(ask));
const s1 = client.messages.stream(ask);
const events = [];
s1.on("streamEvent", (e) => events.push(e.type));
out.plain_stream = strip(await s1.finalMessage());
out.plain_events = events;

// a forced tool call, both ways, then its result sent back
const call = { model, system, max_tokens: 200, temperature: 0, tools: [weather, time],
  tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
  messages: [{ role: "user", content: "What is the weather in Paris?" }] };
out.tool = strip(await client.messages.create(call));
out.tool_stream = strip(await client.messages.stream(call).finalMessage());
const use = out.tool.content.find((b) => b.type === "tool_use");
const turn2 = { ...call, tool_choice: { type: "auto" }, max_tokens: 16, messages: [
  ...call.messages,
  { role: "assistant", content: out.tool.content },
  { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "Sunny, 21 C" }] },
] };
out.tool_result = strip(await client.messages.create(turn2));
out.tool_result_stream = strip(await client.messages.stream(turn2).finalMessage());
out.count = await client.messages.countTokens({ model, system, tools: turn2.tools, messages: turn2.messages });

// any tool
out.any = strip(await client.messages.create({ ...call, tool_choice: { type: "any", disable_parallel_tool_use: true } }));

// errors: the SDK's typed errors carry Anthropic's error shape
const bad = [
  { ...ask, messages: [] },
  { ...ask, temperature: 7 },
  { ...ask, messages: [{ role: "robot", content: "hi" }] },
  { ...ask, tool_choice: { type: "tool", name: "nope" }, tools: [weather] },
  { ...ask, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] },
];
out.errors = [];
for (const b of bad) {
  try {
    await client.messages.create(b);
    out.errors.push(null);
  } catch (e) {
    out.errors.push({ status: e.status, type: e.error?.type, error_type: e.error?.error?.type, message: e.error?.error?.message });
  }
}
try {
  await new Anthropic({ baseURL, apiKey: "wrong", maxRetries: 0 }).messages.create(ask);
  out.auth = null;
} catch (e) {
  out.auth = { status: e.status, error_type: e.error?.error?.type };
}
// and the server still serves
out.after = strip(await client.messages.create(ask));
console.log(JSON.stringify(out));
