// The official `openai` npm client against a running `osprey serve`.
// Usage: node tests/server/openai_client.mjs PORT API_KEY
// Prints one JSON object with what the client saw; exits non-zero when a call throws.
import OpenAI from 'openai';

const [port, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const params = { model: out.models[0], prompt: 'Mr. Knightley was', max_tokens: 20, temperature: 0 };
const whole = await client.completions.create(params);
out.text = whole.choices[0].text;
out.finish_reason = whole.choices[0].finish_reason;
out.usage = whole.usage;

const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
out.chunks = [];
out.stream_usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length) out.chunks.push(chunk.choices[0].text);
  if (chunk.usage) out.stream_usage = chunk.usage;
}

const chatParams = { model: out.models[0], messages: [{ role: 'user', content: 'Hi' }], max_tokens: 16, temperature: 0 };
const chat = await client.chat.completions.create(chatParams);
out.chat_text = chat.choices[0].message.content;
out.chat_chunks = [];
for await (const chunk of await client.chat.completions.create({ ...chatParams, stream: true }))
  if (chunk.choices.length && chunk.choices[0].delta.content) out.chat_chunks.push(chunk.choices[0].delta.content);

try {
  await client.completions.create({ ...params, model: 'no-such-model' });
  out.bad_model = 'no error';
} catch (e) {
  out.bad_model = { status: e.status, type: e.type, code: e.code };
}

try {
  await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
  out.bad_key = 'no error';
} catch (e) {
  out.bad_key = { status: e.status, type: e.type };
}

process.stdout.write(JSON.stringify(out) + '\n');
