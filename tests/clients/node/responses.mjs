// The Responses API through waygate with the clients that default to it: the OpenAI
// Node SDK (`responses.create`, a stream), the Vercel AI SDK's `openai(model)`
// (`generateText`, `streamText`, a tool), and the OpenAI Agents SDK's default model with
// a function tool. Pinned in package-lock.json; `make test` installs them.
//
// Usage: node responses.mjs BASE_URL API_KEY
// (Needs the providers of tests/common/mod.rs: fake, fakeanthropic, fakegemini.) Prints
// "all checks passed" at the end.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, stepCountIs, tool as aiTool } from 'ai';
import { Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled } from '@openai/agents';
import { z } from 'zod';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const ai = createOpenAI({ baseURL, apiKey });
setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey, maxRetries: 0 }));
setTracingDisabled(true);

for (const provider of ['fake', 'fakeanthropic', 'fakegemini']) {
  // The Node SDK: a response, and a stream's typed events.
  const response = await client.responses.create({ model: `${provider}/ok`, input: 'hi' });
  assert.equal(response.object, 'response');
  assert.equal(response.status, 'completed');
  assert.ok(response.id.startsWith('resp_') && response.output_text, JSON.stringify(response));
  const stream = await client.responses.create({ model: `${provider}/long-5`, input: 'count', stream: true });
  const types = [];
  let text = '';
  let completed = null;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.deepEqual(text.split(' '), ['word1', 'word2', 'word3', 'word4', 'word5'], provider);
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress'], provider);
  assert.equal(completed.usage.output_tokens, 5, provider);

  // The AI SDK's default model speaks the Responses API.
  const answer = await generateText({ model: ai(`${provider}/ok`), prompt: 'hi' });
  assert.equal(answer.finishReason, 'stop', provider);
  assert.ok(answer.text && answer.usage.totalTokens > 0, provider);
  const streamed = streamText({ model: ai(`${provider}/long-3`), prompt: 'count' });
  assert.equal(await streamed.text, 'word1 word2 word3', provider);
  assert.equal((await streamed.usage).outputTokens, 3, provider);
  // A tool round trip in two steps: the call, its result sent back, the answer quoting it.
  const weather = aiTool({
    description: 'The weather in a city',
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => `18 degrees in ${city}`,
  });
  const agentic = await generateText({
    model: ai(`${provider}/agent`), prompt: 'Weather in Paris?', tools: { weather }, stopWhen: stepCountIs(3),
  });
  assert.equal(agentic.steps.length, 2, provider);
  assert.ok(agentic.text.includes('18 degrees in'), `${provider}: ${agentic.text}`);

  // The Agents SDK: its default model (the Responses API) and a function tool.
  const getWeather = tool({
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => `sunny in ${city}`,
  });
  const agent = new Agent({ name: 'Weather', instructions: 'Answer with the tool.', model: `${provider}/agent`, tools: [getWeather] });
  const result = await run(agent, 'Weather in Paris?');
  assert.ok(result.finalOutput.includes('sunny in'), `${provider}: ${result.finalOutput}`);
}

// A refusal is the SDK's typed error, naming the field.
await assert.rejects(
  client.responses.create({ model: 'fake/ok', input: 'hi', previous_response_id: 'resp_earlier' }),
  (e) => e instanceof OpenAI.BadRequestError && e.code === 'unsupported_parameter' && e.param === 'previous_response_id',
);
console.log('all checks passed');
