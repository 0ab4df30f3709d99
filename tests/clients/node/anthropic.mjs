// Anthropic's Messages API through waygate with the official Anthropic TypeScript SDK:
// `messages.create`, `messages.stream`, a tool round trip and an image, through each
// provider API. Pinned in package-lock.json; `make test` installs it.
//
// Usage: node anthropic.mjs BASE_URL API_KEY
// (BASE_URL ends in /api/v1; the SDK adds /v1/messages to the part before /v1.)
// Prints "all checks passed" at the end.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new Anthropic({ baseURL: baseURL.replace(/\/v1$/, ''), apiKey, maxRetries: 0 });
const weather = {
  name: 'get_weather',
  description: 'The weather in a city.',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const pixel = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAAAAgABVKJPXQAAAABJRU5ErkJggg==';

for (const provider of ['fake', 'fakeanthropic', 'fakegemini']) {
  const message = await client.messages.create({
    model: `${provider}/ok`, max_tokens: 100, messages: [{ role: 'user', content: 'hi' }],
  });
  assert.equal(message.type, 'message');
  assert.equal(message.stop_reason, 'end_turn');
  assert.ok(message.id.startsWith('msg_') && message.content[0].text, JSON.stringify(message));

  const stream = client.messages.stream({
    model: `${provider}/long-5`, max_tokens: 100, messages: [{ role: 'user', content: 'count' }],
  });
  let text = '';
  stream.on('text', (delta) => { text += delta; });
  const final = await stream.finalMessage();
  assert.deepEqual(text.split(' '), ['word1', 'word2', 'word3', 'word4', 'word5'], provider);
  assert.equal(final.usage.output_tokens, 5, provider);

  const asked = await client.messages.create({
    model: `${provider}/agent`, max_tokens: 100, tools: [weather], messages: [{ role: 'user', content: 'Weather?' }],
  });
  const use = asked.content.find((block) => block.type === 'tool_use');
  assert.equal(use.name, 'get_weather', provider);
  const answered = await client.messages.create({
    model: `${provider}/agent`, max_tokens: 100, tools: [weather], messages: [
      { role: 'user', content: 'Weather?' },
      { role: 'assistant', content: asked.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 degrees' }] },
    ],
  });
  assert.equal(answered.content[0].text, 'The tool said: 18 degrees', provider);

  const seen = await client.messages.create({
    model: `${provider}/echo`, max_tokens: 100, messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: pixel } },
      { type: 'text', text: 'What is this?' },
    ] }],
  });
  assert.ok(seen.content[0].text.includes(pixel), `${provider}: ${seen.content[0].text}`);
}

await assert.rejects(
  client.messages.create({ model: 'atlantis/x', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }),
  (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error',
);
console.log('all checks passed');
