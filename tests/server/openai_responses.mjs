// The official `openai` npm client's `responses` resource against a running `osprey serve`.
// Usage:
//   node tests/server/openai_responses.mjs text PORT API_KEY MODEL
//     a whole response, the same streamed, a chained turn, retrieve and delete, errors;
//   node tests/server/openai_responses.mjs tools PORT REQUEST.json RESULT
//     REQUEST.json: the first turn's Responses request (instructions, input, tools,
//     tool_choice); the call whole and streamed, then the next turn with the call's result
//     (RESULT, a string) through previous_response_id, and the same conversation sent whole.
// Prints one JSON object with what the client saw; exits non-zero when a call that should
// succeed throws.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

import { failure as failureOf } from './client_failure.mjs';

const [mode, port, ...rest] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const out = {};

const failure = (call) =>
  failureOf(call, (e) => ({
    status: e.status ?? null,
    bad_request: e instanceof OpenAI.BadRequestError,
    not_found: e instanceof OpenAI.NotFoundError,
    param: e.param ?? null,
    code: e.code ?? null,
    message: e.message ?? String(e),
  }));

if (mode === 'text') {
  const [apiKey, model] = rest;
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
  const params = { model, input: 'Mr. Knightley was', max_output_tokens: 20, temperature: 0 };
  out.whole = await client.responses.create(params);
  out.whole_text = out.whole.output_text;

  // The stream helper checks every event against the snapshot it builds.
  const stream = client.responses.stream(params);
  out.events = [];
  out.deltas = [];
  out.sequence = [];
  stream.on('event', (event) => {
    out.events.push(event.type);
    out.sequence.push(event.sequence_number);
  });
  stream.on('response.output_text.delta', (event) => out.deltas.push(event.delta));
  out.streamed = await stream.finalResponse();
  out.streamed_text = out.streamed.output_text;

  // stream: true without the helper: the raw events.
  out.raw_types = [];
  for await (const event of await client.responses.create({ ...params, stream: true })) out.raw_types.push(event.type);

  // A chained turn, and the same conversation sent whole: the same prompt.
  const next = 'And then?';
  out.chained = await client.responses.create({ ...params, previous_response_id: out.whole.id, input: next,
                                                metadata: { turn: '2' } });
  out.sent_whole = await client.responses.create({
    ...params,
    input: [
      { role: 'user', content: params.input },
      { role: 'assistant', content: [{ type: 'output_text', text: out.whole_text }] },
      { role: 'user', content: [{ type: 'input_text', text: next }] },
    ],
  });
  out.retrieved = await client.responses.retrieve(out.chained.id);

  const unstored = await client.responses.create({ ...params, store: false });
  out.unstored_get = await failure(() => client.responses.retrieve(unstored.id));
  await client.responses.delete(out.whole.id);
  out.deleted_get = await failure(() => client.responses.retrieve(out.whole.id));
  out.deleted_chain = await failure(() =>
    client.responses.create({ ...params, previous_response_id: out.whole.id }));
  out.unknown_previous = await failure(() =>
    client.responses.create({ ...params, previous_response_id: 'resp_no_such_response' }));
  out.web_search = await failure(() => client.responses.create({ ...params, tools: [{ type: 'web_search' }] }));
  out.bad_key = await failure(() =>
    new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).responses.create(params));
} else if (mode === 'tools') {
  const [requestPath, result] = rest;
  const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const request = JSON.parse(readFileSync(requestPath, 'utf8'));
  const params = { ...request, temperature: 0 };
  out.whole = await client.responses.create(params);

  const stream = client.responses.stream(params);
  out.arguments_deltas = [];
  stream.on('response.function_call_arguments.delta', (event) => out.arguments_deltas.push(event.delta));
  stream.on('response.function_call_arguments.done', (event) => (out.arguments_done = event.arguments));
  out.streamed = await stream.finalResponse();

  // The next turn: the call's result, after the stored response.
  const call = out.whole.output.find((item) => item.type === 'function_call');
  const followUp = { instructions: request.instructions, tools: request.tools, temperature: 0 };
  out.next = await client.responses.create({
    ...followUp,
    previous_response_id: out.whole.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: result }],
  });
  // The same conversation, every item sent.
  out.next_whole = await client.responses.create({
    ...followUp,
    input: [
      ...request.input,
      { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
      { type: 'function_call_output', call_id: call.call_id, output: result },
    ],
  });
} else {
  throw new Error(`unknown mode ${mode}`);
}

process.stdout.write(JSON.stringify(out) + '\n');
