// The official `openai` and `@anthropic-ai/sdk` npm clients sending an image to a running
// `osprey serve` (a model with a vision tower).
// Usage: node tests/server/image_clients.mjs PORT MODEL IMAGE OTHER_IMAGE
// Prints one JSON object with what the clients saw; exits non-zero when a call that should
// succeed throws.
import fs from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const [port, model, image, other] = process.argv.slice(2);
const openai = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const mediaType = (f) => ({ png: 'image/png', jpg: 'image/jpeg', webp: 'image/webp', gif: 'image/gif' })[f.split('.').pop()];
const base64 = (f) => fs.readFileSync(f).toString('base64');
const dataUrl = (f) => `data:${mediaType(f)};base64,${base64(f)}`;
const text = 'Describe this.';
const out = {};

// Chat completions: the image before the text, greedy, with each token's logprobs.
const chat = async (f) => {
  const r = await openai.chat.completions.create({
    model,
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl(f), detail: 'auto' } }, { type: 'text', text }] }],
    max_tokens: 8,
    temperature: 0,
    logprobs: true,
    top_logprobs: 5,
  });
  return {
    text: r.choices[0].message.content,
    pieces: r.choices[0].logprobs.content.map((t) => t.bytes),
    first_top: r.choices[0].logprobs.content[0].top_logprobs,
    usage: r.usage,
  };
};
out.openai = await chat(image);
out.openai_other = await chat(other);
out.openai_again = await chat(image);

// Messages: the same turn as an image block of base64.
const message = await anthropic.messages.create({
  model,
  max_tokens: 8,
  temperature: 0,
  messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: mediaType(image), data: base64(image) } }, { type: 'text', text }] }],
});
out.anthropic = { text: message.content.length ? message.content[0].text : '', usage: message.usage };

// A url source is refused by name: the server fetches nothing.
try {
  await anthropic.messages.create({
    model,
    max_tokens: 8,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }, { type: 'text', text }] }],
  });
  out.anthropic_url = { status: 200 };
} catch (e) {
  out.anthropic_url = { status: e.status, message: e.error?.error?.message ?? String(e) };
}

// Responses: an input_image part with a data: URL.
const response = await openai.responses.create({
  model,
  max_output_tokens: 8,
  temperature: 0,
  input: [{ role: 'user', content: [{ type: 'input_image', image_url: dataUrl(image) }, { type: 'input_text', text }] }],
});
out.responses = { text: response.output_text };

console.log(JSON.stringify(out));
