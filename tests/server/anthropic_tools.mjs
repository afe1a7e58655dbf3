// The official `@anthropic-ai/sdk` npm client reading a forced tool call from a running
// `osprey serve`, whole and streamed, then counting the next turn's prompt (the call and its
// result).
// Usage: node tests/server/anthropic_tools.mjs PORT REQUEST.json RESULT
//   REQUEST.json: the first turn's Messages request (system, messages, tools, tool_choice);
//   RESULT: the tool's result, a string.
// Prints one JSON object with what the client saw; exits non-zero when a call throws.
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';

const [port, requestPath, result] = process.argv.slice(2);
const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const request = JSON.parse(readFileSync(requestPath, 'utf8'));
const params = { ...request, max_tokens: 200, temperature: 0 };
const out = {};

out.whole = await client.messages.create(params);

// The stream helper assembles the tool_use block's input from its input_json_delta events.
const stream = client.messages.stream(params);
out.partial_json = [];
stream.on('streamEvent', (event) => {
  if (event.type === 'content_block_delta' && event.delta.type === 'input_json_delta')
    out.partial_json.push(event.delta.partial_json);
});
out.streamed = await stream.finalMessage();

// The next turn: the reply as the client returned it, and the call's result.
const call = out.whole.content.find((b) => b.type === 'tool_use');
const next = [
  ...request.messages,
  { role: 'assistant', content: out.whole.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: result }] },
];
out.next_count = await client.messages.countTokens({
  model: request.model,
  system: request.system,
  tools: request.tools,
  messages: next,
});

console.log(JSON.stringify(out));
