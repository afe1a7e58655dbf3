// The server's OpenAI routes, as the page uses them: the model list and streamed chat
// completions (a user message's images as image_url parts of data: URLs). Errors become ApiError with the server's own message.
import { createParser } from 'eventsource-parser';

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(apiKey) {
  const h = { 'Content-Type': 'application/json' };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

async function errorOf(res) {
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) message = `${res.status}: ${body.error.message}`;
  } catch {
    // not JSON: the status line says it
  }
  return new ApiError(res.status, message);
}

// The served models: [{id, images}], `images` true when the model reads images (its entry's
// meta.input_modalities holds "image").
export async function fetchModels(apiKey) {
  const res = await fetch('/v1/models', { headers: headers(apiKey) });
  if (!res.ok) throw await errorOf(res);
  const body = await res.json();
  return (body.data || []).map((m) => ({ id: m.id, images: ((m.meta && m.meta.input_modalities) || []).includes('image') }));
}

// Streams one chat completion. onDelta(text) gets each piece of the reply as it arrives;
// resolves to {usage, finishReason}. Aborting `signal` closes the connection, which makes the
// server cancel the request and free its slot.
export async function streamChat({ body, apiKey, signal, onDelta }) {
  const res = await fetch('/v1/chat/completions', {
    method: 'POST',
    headers: headers(apiKey),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!res.ok) throw await errorOf(res);
  let usage = null;
  let finishReason = null;
  let failure = null;
  const parser = createParser({
    onEvent(event) {
      if (event.data === '[DONE]' || failure) return;
      let chunk;
      try {
        chunk = JSON.parse(event.data);
      } catch {
        failure = new ApiError(0, `the server sent an event that is not JSON: ${event.data.slice(0, 80)}`);
        return;
      }
      if (chunk.error) {
        failure = new ApiError(chunk.error.code || 500, chunk.error.message || 'the server reported an error');
        return;
      }
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const text = choice.delta && choice.delta.content;
        if (text) onDelta(text);
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
    },
  });
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    parser.feed(value);
    if (failure) {
      reader.cancel();
      throw failure;
    }
  }
  return { usage, finishReason };
}
