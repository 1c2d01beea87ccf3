// tests/openai_client.mjs -- build/serve driven by a client no one here wrote:
// the official `openai` npm package (tests/test_serve.cpp installs it into
// build/deps/node and runs this). One completion, one completion stream, one
// chat stream, and one bad request, printed as one JSON object for the test
// to compare with the engine's own tokens.
//
// Usage: node tests/openai_client.mjs PORT DIR   (DIR holds node_modules/openai)
import { createRequire } from 'node:module';
import path from 'node:path';

const [port, dir] = process.argv.slice(2);
const require = createRequire(path.resolve(dir) + '/');
const OpenAI = require('openai').default ?? require('openai');

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 30000 });
const ask = { model: 'built-in', max_tokens: 12, temperature: 0 };
const prompt = 'Once upon a time';

const c = await client.completions.create({ ...ask, prompt });

let text = '', chunks = 0;
for await (const ch of await client.completions.create({ ...ask, prompt, stream: true })) {
  chunks++;
  text += ch.choices[0]?.text ?? '';
}

let chat = '', chat_finish = null;
const messages = [{ role: 'user', content: prompt }];
for await (const ch of await client.chat.completions.create({ ...ask, messages, stream: true })) {
  chat += ch.choices[0]?.delta?.content ?? '';
  chat_finish = ch.choices[0]?.finish_reason ?? chat_finish;
}

let error = null;
try {
  await client.completions.create({ ...ask, prompt, max_tokens: 0 });
} catch (e) {
  error = { status: e.status, code: e.code, param: e.param, type: e.type, message: e.message };
}

console.log(JSON.stringify({
  completion: { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage },
  completion_stream: { text, chunks },
  chat_stream: { text: chat, finish_reason: chat_finish },
  error,
}));
