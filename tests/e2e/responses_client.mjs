// Drives a thaw server with the official `openai` npm SDK's Responses API
// and prints what the SDK parsed, as one JSON line, for test_responses.py.
// usage: node responses_client.mjs BASE_URL API_KEY
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const model = "thaw";
const weather = {
  type: "function", name: "get_weather", description: "Current weather of a city",
  parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "London"] } }, required: ["city"] },
};
const strip = (r) => ({ id: r.id, status: r.status, output: r.output, output_text: r.output_text, usage: r.usage });
const out = {};

// plain text, both ways
const ask = { model, instructions: "You are a terse assistant.", max_output_tokens: 24, temperature: 0, store: false,
  input: [{ role: "developer", content: "Answer in English." },
          { role: "user", content: [{ type: "input_text", text: "Tell me about the sea and the sky." }] }] };
out.plain = strip(await client.responses.create(ask));
const s1 = client.responses.stream(ask);
const events = [];
s1.on("event", (e) => events.push(e.type));
out.plain_stream = strip(await s1.finalResponse());
out.plain_events = events;

// a forced call, both ways, then its output sent back
const call = { model, max_output_tokens: 200, temperature: 0, store: false, tools: [weather],
  tool_choice: { type: "function", name: "get_weather" }, parallel_tool_calls: false,
  input: "What is the weather in Paris?" };
out.tool = strip(await client.responses.create(call));
out.tool_stream = strip(await client.responses.stream(call).finalResponse());
const fc = out.tool.output.find((i) => i.type === "function_call");
const turn2 = { ...call, tool_choice: "auto", max_output_tokens: 16, input: [
  { role: "user", content: "What is the weather in Paris?" },
  ...out.tool.output,
  { type: "function_call_output", call_id: fc.call_id, output: "Sunny, 21 C" },
] };
out.tool_result = strip(await client.responses.create(turn2));
out.tool_result_stream = strip(await client.responses.stream(turn2).finalResponse());

const bad = [
  { ...ask, input: [] },
  { ...ask, store: true },
  { ...ask, previous_response_id: "resp_x" },
  { ...ask, input: [{ type: "function_call", name: "f" }] },
  { ...ask, text: { format: { type: "yaml" } } },
  { ...ask, input: [{ role: "user", content: [{ type: "input_image", image_url: "data:image/png;base64,AA==" }] }] },
];
out.errors = [];
for (const b of bad) {
  try {
    await client.responses.create(b);
    out.errors.push(null);
  } catch (e) {
    out.errors.push({ status: e.status, message: e.message });
  }
}
out.after = strip(await client.responses.create(ask));
console.log(JSON.stringify(out));
