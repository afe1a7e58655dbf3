// The official `openai` npm client's embeddings.create against a running `osprey serve`.
// Usage: node tests/server/openai_embeddings.mjs PORT MODEL 'TEXT_JSON' 'IDS_JSON'
// Prints one JSON object with what the client saw; exits non-zero when a call throws.
import OpenAI from 'openai';

const [port, model, textsJson, idsJson] = process.argv.slice(2);
const texts = JSON.parse(textsJson);
const ids = JSON.parse(idsJson);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const out = {};

// encoding_format "float": arrays of numbers as sent.
const floats = await client.embeddings.create({ model, input: texts, encoding_format: 'float' });
out.float = floats.data.map((d) => d.embedding);
out.float_index = floats.data.map((d) => d.index);
out.usage = floats.usage;
out.model = floats.model;

// No encoding_format: the SDK asks for base64 and decodes it to floats itself.
const decoded = await client.embeddings.create({ model, input: texts });
out.sdk_decoded = decoded.data.map((d) => Array.from(d.embedding));

// encoding_format "base64" given: the SDK returns the string; decode it as little-endian f32.
const b64 = await client.embeddings.create({ model, input: texts, encoding_format: 'base64' });
out.base64_decoded = b64.data.map((d) => {
  const bytes = Buffer.from(d.embedding, 'base64');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const v = [];
  for (let i = 0; i < bytes.byteLength; i += 4) v.push(view.getFloat32(i, true));
  return v;
});

const tokens = await client.embeddings.create({ model, input: [ids], encoding_format: 'float' });
out.tokens = tokens.data[0].embedding;

const cut = await client.embeddings.create({ model, input: texts[0], dimensions: 16, encoding_format: 'float' });
out.dimensions = cut.data[0].embedding;

try {
  await client.embeddings.create({ model, input: '' });
  out.empty = 'no error';
} catch (e) {
  out.empty = { status: e.status, param: e.param, message: e.message };
}

console.log(JSON.stringify(out));
