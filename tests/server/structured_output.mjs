// Constrained decoding against a running `osprey serve`, judged by an independent JSON Schema
// validator (ajv with ajv-formats): COUNT random schemas from a seeded generator, each sent
// once (chat with response_format json_schema through the `openai` client, or a completion
// with llama-server's top-level json_schema) at a random sampler setting with temperature > 0;
// then one json_schema chat request streamed through the client's stream helper.
// Usage: node tests/server/structured_output.mjs PORT COUNT SEED
// Prints one JSON object: counts of valid, invalid (with examples), cut (finish_reason length,
// counted apart), failed requests, and the streamed request's verdict.
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';

const [port, countArg, seedArg] = process.argv.slice(2);
const count = Number(countArg);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

// mulberry32
let state = Number(seedArg) >>> 0;
function rand() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (a) => a[int(0, a.length - 1)];
const words = ['id', 'name', 'kind', 'size', 'tags', 'when', 'ok', 'note', 'price', 'owner', 'items', 'level'];

function scalar() {
  switch (int(0, 11)) {
    case 0: return { type: 'string', maxLength: int(0, 10) };
    case 1: { const lo = int(0, 4); return { type: 'string', minLength: lo, maxLength: lo + int(0, 6) }; }
    case 2: return { type: 'string', format: pick(['date', 'date-time', 'uuid', 'email', 'time']) };
    case 3: return { type: 'string', pattern: pick(['^[A-Z]{2}-\\d{2,4}$', '^(red|green|blue)$', '^[a-z]+@[a-z]+\\.org$', 'x\\d']) };
    case 4: { const lo = int(-300, 300); return { type: 'integer', minimum: lo, maximum: lo + int(0, 2000) }; }
    case 5: return rand() < 0.5 ? { type: 'integer' } : { type: 'integer', exclusiveMinimum: int(-50, 50) };
    case 6: { const lo = int(-20, 20); return { type: 'number', minimum: lo - 0.5, maximum: lo + int(1, 50) + 0.25 }; }
    case 7: return { type: 'number' };
    case 8: return { type: 'boolean' };
    case 9: return { enum: [pick(['a', 'b c', 'é']), int(-5, 5), null, true].slice(0, int(1, 4)) };
    case 10: return { const: pick(['fixed', 42, false, null, { k: [1, 'two'] }]) };
    default: return { type: ['string', 'null'], maxLength: int(0, 6) };
  }
}

function schema(depth) {
  const r = rand();
  if (depth >= 3 || r < 0.35) return scalar();
  if (r < 0.55) return { type: 'array', items: schema(depth + 1), minItems: int(0, 2), maxItems: int(2, 4) };
  if (r < 0.65) return { anyOf: [{ type: 'integer', minimum: 0, maximum: 9 }, { type: 'string', maxLength: 3 }, schema(depth + 1)].slice(0, int(2, 3)) };
  if (r < 0.7) return { oneOf: [{ type: 'boolean' }, { type: 'null' }] };
  const properties = {};
  const required = [];
  const n = int(1, 4);
  for (let i = 0; i < n; ++i) {
    const key = words[int(0, words.length - 1)] + (i > 0 ? String(i) : '');
    properties[key] = schema(depth + 1);
    if (rand() < 0.6) required.push(key);
  }
  return { type: 'object', properties, required, additionalProperties: false };
}

function topSchema() {
  if (rand() < 0.15) {
    return { $defs: { item: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 99 }, label: { type: 'string', maxLength: 5 } }, required: ['v'], additionalProperties: false } },
      type: 'object', properties: { list: { type: 'array', items: { $ref: '#/$defs/item' }, maxItems: 3 } }, required: ['list'], additionalProperties: false };
  }
  return rand() < 0.8 ? { type: 'object', ...objectOf(schema(0)) } : schema(0);
}
function objectOf(s) {
  return s.type === 'object' ? s : { properties: { value: s }, required: ['value'], additionalProperties: false };
}

function sampling() {
  const p = { temperature: 0.5 + rand(), seed: int(0, 1e9) };
  if (rand() < 0.3) p.top_p = 0.5 + rand() / 2;
  if (rand() < 0.3) p.top_k = int(1, 50);
  if (rand() < 0.3) p.min_p = rand() / 5;
  if (rand() < 0.2) p.logit_bias = { [String(int(2, 4000))]: -100, [String(int(2, 4000))]: 5 };
  return p;
}

const out = { n: 0, valid: 0, invalid: 0, cut: 0, failed: 0, invalid_examples: [], failures: [] };
function judge(schemaObj, text, finish, where) {
  out.n++;
  if (finish === 'length') { out.cut++; return; }
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    out.invalid++;
    if (out.invalid_examples.length < 5) out.invalid_examples.push({ where, schema: schemaObj, text, error: String(e) });
    return;
  }
  const validate = ajv.compile(schemaObj);
  if (validate(value)) out.valid++;
  else {
    out.invalid++;
    if (out.invalid_examples.length < 5) out.invalid_examples.push({ where, schema: schemaObj, text, errors: validate.errors });
  }
}

async function one(i) {
  const s = topSchema();
  const params = { model: 'demo', max_tokens: 300, ...sampling() };
  try {
    if (i % 2 === 0) {
      const r = await client.chat.completions.create({ ...params, messages: [{ role: 'user', content: `Describe item ${i} as JSON.` }],
        response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema: s, strict: true } } });
      judge(s, r.choices[0].message.content, r.choices[0].finish_reason, `chat ${i}`);
    } else {
      const r = await client.completions.create({ ...params, prompt: `Item ${i}:`, json_schema: s });
      judge(s, r.choices[0].text, r.choices[0].finish_reason, `completion ${i}`);
    }
  } catch (e) {
    out.failed++;
    if (out.failures.length < 5) out.failures.push({ i, schema: s, error: String(e) });
  }
}

// Eight requests in flight at a time, so that the engine batches them.
let next = 0;
await Promise.all(Array.from({ length: 8 }, async () => {
  while (next < count) await one(next++);
}));

// Streamed: the client's helper assembles the deltas.
const streamSchema = { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, rank: { type: 'integer', minimum: 1, maximum: 3 },
  tags: { type: 'array', items: { enum: ['old', 'new'] }, maxItems: 2 } }, required: ['city', 'rank', 'tags'], additionalProperties: false };
const stream = client.chat.completions.stream({ model: 'demo', max_tokens: 200, temperature: 0.9, seed: 7,
  messages: [{ role: 'user', content: 'A city as JSON.' }],
  response_format: { type: 'json_schema', json_schema: { name: 'city', schema: streamSchema, strict: true } } });
let chunks = 0;
stream.on('content', () => { chunks++; });
const final = await stream.finalChatCompletion();
const text = final.choices[0].message.content;
let streamValid = false;
try { streamValid = ajv.compile(streamSchema)(JSON.parse(text)); } catch { streamValid = false; }
out.stream = { text, finish_reason: final.choices[0].finish_reason, chunks, valid: streamValid };

console.log(JSON.stringify(out));
