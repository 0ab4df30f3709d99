"""The official OpenAI Python client against Anthropic- and Gemini-backed models
behind waygate: chat, stream, tools (answer, stream, and the result sent back),
JSON mode and an image, the same checks for every provider.

Usage: python openai_client_providers.py BASE_URL API_KEY
(Needs providers `fakeanthropic` and `fakegemini` as in tests/common/mod.rs.)
"""
import json
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "multiply",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
         "AAAABJRU5ErkJggg==")

for provider in ["fakeanthropic", "fakegemini"]:
    # Non-streaming chat.
    chat = client.chat.completions.create(model=f"{provider}/ok", messages=[{"role": "user", "content": "hi"}])
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl_"), chat
    assert chat.model == f"{provider}/ok", chat.model
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content, chat
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens > 0

    # Streaming chat with usage.
    chunks = list(client.chat.completions.create(
        model=f"{provider}/long-5", messages=[{"role": "user", "content": "count"}],
        stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1, chunks
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["word1", "word2", "word3", "word4", "word5"], text
    assert chunks[-2].choices[0].finish_reason == "stop", chunks[-2]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, chunks[-1]

    # Tool calls, then the tool's result sent back.
    messages = [{"role": "user", "content": "2 and 3?"}]
    answer = client.chat.completions.create(model=f"{provider}/tool", messages=messages, tools=TOOLS)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls", answer
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "add", call
    json.loads(call.function.arguments)
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    follow_up = client.chat.completions.create(model=f"{provider}/ok", messages=messages, tools=TOOLS)
    assert follow_up.choices[0].finish_reason == "stop", follow_up

    # Parallel tool calls streamed: the SDK's accumulator sees indexes 0 and 1.
    with client.beta.chat.completions.stream(
            model=f"{provider}/tools", messages=[{"role": "user", "content": "2 and 3?"}], tools=TOOLS) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["add", "multiply"], calls
    assert all(isinstance(json.loads(c.function.arguments), dict) for c in calls)
    assert final.choices[0].finish_reason == "tool_calls"

    # JSON mode.
    as_json = client.chat.completions.create(
        model=f"{provider}/json", messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_object"})
    assert isinstance(json.loads(as_json.choices[0].message.content), dict), as_json

    # An image.
    seen = client.chat.completions.create(model=f"{provider}/ok", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": PIXEL}}]}])
    assert seen.choices[0].message.content, seen

    # A provider error arrives as the client's typed exception.
    try:
        client.chat.completions.create(model=f"{provider}/status-429", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected a rate limit error")
    except openai.RateLimitError as e:
        assert e.body["code"] == "upstream_rate_limited", e.body

print("all checks passed")
