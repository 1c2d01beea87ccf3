// tests/openai_shutdown.mjs -- build/serve shut down under the official `openai`
// npm package (tests/test_serve_edge.cpp runs it). Two long streams, a
// completion and a chat; once both have a chunk, SIGTERM goes to the server;
// then each stream is read to its end. A stream the server cuts must make the
// client raise (an error event) or carry a finish_reason: never end quietly,
// looking like a whole answer. Printed as one JSON object, with the moment of
// the signal (Unix epoch, ms): the test, the server's parent, times its exit.
//
// Usage: node tests/openai_shutdown.mjs PORT DIR SERVER_PID   (DIR holds node_modules/openai)
import { createRequire } from 'node:module';
import path from 'node:path';

const [port, dir, pid] = process.argv.slice(2);
const require = createRequire(path.resolve(dir) + '/');
const OpenAI = require('openai').default ?? require('openai');

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 30000 });
const ask = { model: 'built-in', max_tokens: 400, temperature: 0, ignore_eos: true };

let started = 0;
const bothStarted = new Promise((resolve) => {
  const tick = () => (started >= 2 ? resolve() : setTimeout(tick, 5));
  tick();
});

async function read(stream, piece) {
  const out = { chunks: 0, finish_reason: null, error: null };
  try {
    for await (const ch of await stream) {
      if (out.chunks++ === 0) started++;
      piece(ch);
      out.finish_reason = ch.choices?.[0]?.finish_reason ?? out.finish_reason;
    }
  } catch (e) {
    out.error = { name: e.constructor?.name ?? 'Error', message: String(e.message ?? e) };
  }
  return out;
}

const completion = read(client.completions.create({ ...ask, prompt: 'Once upon a time', stream: true }), () => {});
const chat = read(client.chat.completions.create({ ...ask, messages: [{ role: 'user', content: 'Once upon a time' }], stream: true }), () => {});

await bothStarted;
const signal_at_ms = Date.now();
process.kill(Number(pid), 'SIGTERM');
const [c, h] = await Promise.all([completion, chat]);
console.log(JSON.stringify({ completion: c, chat: h, signal_at_ms }));
