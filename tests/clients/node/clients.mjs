// The official OpenAI Node SDK and the Vercel AI SDK against the running gateway:
// what a TypeScript user's code sees (typed answers and errors, stream iteration, the
// AI SDK's stream parts). Pinned in package-lock.json; `make test` installs them.
//
// Usage: node clients.mjs BASE_URL API_KEY
// (Needs the providers and models of tests/common/mod.rs: fake, fakeanthropic, fakegemini,
// demo/chat.) Prints "all checks passed" at the end.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, tool } from 'ai';
import { z } from 'zod';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const hi = [{ role: 'user', content: 'hi' }];

for (const provider of ['fake', 'fakeanthropic', 'fakegemini']) {
  // A chat answer and a stream with usage.
  const chat = await client.chat.completions.create({ model: `${provider}/ok`, messages: hi });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.model, `${provider}/ok`);
  assert.ok(chat.choices[0].message.content, JSON.stringify(chat));
  const stream = await client.chat.completions.create({
    model: `${provider}/long-5`, messages: hi, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    usage = chunk.usage ?? usage;
  }
  assert.deepEqual(text.split(' '), ['word1', 'word2', 'word3', 'word4', 'word5'], provider);
  assert.equal(usage.completion_tokens, 5, provider);

  // An answer cut after its headers: Envoy's own 502, in the contract's envelope.
  await assert.rejects(
    client.chat.completions.create({ model: `${provider}/cut-3`, messages: hi }),
    (e) => e instanceof OpenAI.InternalServerError && e.status === 502 && e.code === 'upstream_error',
  );

  // The AI SDK: a tool-call stream has the tool call and no text part.
  const ai = createOpenAI({ baseURL, apiKey });
  const add = tool({ description: 'Adds two numbers', inputSchema: z.object({ a: z.number(), b: z.number() }) });
  const parts = [];
  for await (const part of streamText({ model: ai.chat(`${provider}/tool`), prompt: '2 and 3?', tools: { add } }).fullStream) {
    parts.push(part.type);
  }
  assert.ok(parts.includes('tool-call'), `${provider}: ${parts}`);
  assert.ok(!parts.some((p) => p.startsWith('text')), `${provider}: ${parts}`);
  const answer = await generateText({ model: ai.chat(`${provider}/ok`), prompt: 'hi' });
  assert.equal(answer.finishReason, 'stop', provider);
  assert.ok(answer.text && answer.usage.totalTokens > 0, provider);
}

// One model, and the client's typed errors with the contract's codes.
const model = await client.models.retrieve('demo/chat');
assert.deepEqual([model.id, model.object], ['demo/chat', 'model']);
await assert.rejects(
  client.chat.completions.create({ model: 'atlantis/x', messages: hi }),
  (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found' && e.param === 'model',
);
await assert.rejects(
  new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list(),
  (e) => e instanceof OpenAI.AuthenticationError,
);
console.log('all checks passed');
