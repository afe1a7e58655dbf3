// The official `@anthropic-ai/sdk` npm client against a running `osprey serve`.
// Usage: node tests/server/anthropic_client.mjs PORT API_KEY MODEL
// Prints one JSON object with what the client saw; exits non-zero when a call that should
// succeed throws.
import Anthropic from '@anthropic-ai/sdk';

import { failure as failureOf } from './client_failure.mjs';

const [port, apiKey, model] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}`;
// The client sends its key as x-api-key (and anthropic-version), as it does to Anthropic.
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const out = {};

const messages = [{ role: 'user', content: 'Mr. Knightley was' }];
const params = { model, max_tokens: 20, temperature: 0, messages };
out.whole = await client.messages.create(params);

// The client's stream helper checks the event order and assembles the message.
const stream = client.messages.stream(params);
out.events = [];
out.deltas = [];
stream.on('streamEvent', (event) => out.events.push(event.type));
stream.on('text', (delta) => out.deltas.push(delta));
out.streamed = await stream.finalMessage();

// The same prompt with a system prompt given as blocks.
out.count = await client.messages.countTokens({ model, messages });
out.count_system = await client.messages.countTokens({
  model,
  messages,
  system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
});

// A piece of the greedy reply, as a stop sequence, ends the reply before it.
const text = out.whole.content[0].text;
const stop = text.slice(6, 10);
const stopped = await client.messages.create({ ...params, stop_sequences: ['never written', stop] });
out.stop = {
  sequence: stop,
  expected: text.slice(0, text.indexOf(stop)),
  text: stopped.content.length ? stopped.content[0].text : '',
  stop_reason: stopped.stop_reason,
  stop_sequence: stopped.stop_sequence,
};
const streamedStop = await client.messages.stream({ ...params, stop_sequences: [stop] }).finalMessage();
out.stream_stop = { stop_reason: streamedStop.stop_reason, stop_sequence: streamedStop.stop_sequence };

const failure = (call) =>
  failureOf(call, (e) => ({
    status: e.status,
    authentication: e instanceof Anthropic.AuthenticationError,
    bad_request: e instanceof Anthropic.BadRequestError,
    not_found: e instanceof Anthropic.NotFoundError,
    type: e.error?.error?.type ?? null,
    message: e.error?.error?.message ?? String(e),
  }));
out.bad_key = await failure(() =>
  new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 }).messages.create(params));
out.no_max_tokens = await failure(() => client.messages.create({ model, messages }));
out.bad_model = await failure(() => client.messages.create({ ...params, model: 'claude-no-such-model' }));
out.image = await failure(() =>
  client.messages.create({
    ...params,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }],
  }));

process.stdout.write(JSON.stringify(out) + '\n');
