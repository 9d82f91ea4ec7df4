// Drives thaw with the official `openai` npm SDK the way an agent does:
// one request with `tools`, non-streamed and streamed, and prints both
// tool calls as the SDK parsed them (the streamed one assembled from its
// deltas) as one JSON line for test_agents.py.
// With `once`, one non-streamed request and the completion as the SDK
// returned it (an agent loop's step: the caller echoes that message back).
// usage: node openai_agent.mjs BASE_URL REQUEST_JSON [once]
import OpenAI from "openai";

const [baseURL, requestJson, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const req = JSON.parse(requestJson);
const out = {};

if (mode === "once") {
  console.log(JSON.stringify(await client.chat.completions.create({ ...req, stream: false })));
  process.exit(0);
}

const c = await client.chat.completions.create({ ...req, stream: false });
out.plain = { message: c.choices[0].message, finish_reason: c.choices[0].finish_reason };

const stream = await client.chat.completions.create({ ...req, stream: true });
const calls = [];
let content = "", reasoning = "", finish = null;
for await (const chunk of stream) {
  for (const ch of chunk.choices) {
    const d = ch.delta ?? {};
    content += d.content ?? "";
    reasoning += d.reasoning_content ?? "";
    for (const tc of d.tool_calls ?? []) {
      // OpenAI's rules: index always; id, type and name once; arguments in pieces
      if (!calls[tc.index]) calls[tc.index] = { id: tc.id, type: tc.type, function: { name: "", arguments: "" } };
      if (tc.function?.name) calls[tc.index].function.name += tc.function.name;
      if (tc.function?.arguments) calls[tc.index].function.arguments += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
out.stream = { content, reasoning_content: reasoning, tool_calls: calls, finish_reason: finish };
console.log(JSON.stringify(out));
