// The official `openai` npm client reading tool calls from a running `osprey serve`, whole and
// streamed, then sending the next turn with the calls' results.
// Usage: node tests/server/openai_tools.mjs PORT REQUEST.json RESULTS.json
//   REQUEST.json: the first turn's chat request (messages, tools); RESULTS.json: one tool
//   result string per call, in order.
// Prints one JSON object with what the client saw; exits non-zero when a call throws.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const [port, requestPath, resultsPath] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const request = JSON.parse(readFileSync(requestPath, 'utf8'));
const results = JSON.parse(readFileSync(resultsPath, 'utf8'));
const model = (await client.models.list()).data[0].id;
const params = { ...request, model, temperature: 0 };
const out = {};

const whole = await client.chat.completions.create(params);
out.whole = { message: whole.choices[0].message, finish_reason: whole.choices[0].finish_reason };

// The client's own stream helper assembles the deltas into a message.
const stream = client.chat.completions.stream(params);
const final = await stream.finalChatCompletion();
out.streamed = { message: final.choices[0].message, finish_reason: final.choices[0].finish_reason };

// Two choices, streamed: the client's accumulator assembles each choice's calls from its
// chunks; the raw chunks give each call's argument fragments.
const final2 = await client.chat.completions.stream({ ...params, n: 2 }).finalChatCompletion();
out.streamed_n2 = final2.choices.map((c) => ({ index: c.index, message: c.message, finish_reason: c.finish_reason }));
out.fragments = {};
for await (const chunk of await client.chat.completions.create({ ...params, n: 2, stream: true }))
  for (const choice of chunk.choices)
    for (const call of choice.delta.tool_calls ?? []) {
      const key = `${choice.index}.${call.index}`;
      out.fragments[key] ??= [];
      if (call.function?.arguments) out.fragments[key].push(call.function.arguments);
    }
// Every call's accumulated arguments parse.
out.parsed = Object.fromEntries(Object.entries(out.fragments).map(([k, f]) => [k, JSON.parse(f.join(''))]));

// The next turn: the reply as the client returned it, and each call's result.
const message = whole.choices[0].message;
const messages = [...request.messages, message];
message.tool_calls.forEach((call, i) => messages.push({ role: 'tool', tool_call_id: call.id, content: results[i] }));
const rendered = await fetch(`http://127.0.0.1:${port}/apply-template`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ ...params, messages }),
});
if (!rendered.ok) throw new Error(`apply-template: ${rendered.status} ${await rendered.text()}`);
out.next_prompt = (await rendered.json()).prompt;
const next = await client.chat.completions.create({ ...params, messages });
out.next_finish_reason = next.choices[0].finish_reason;

console.log(JSON.stringify(out));
