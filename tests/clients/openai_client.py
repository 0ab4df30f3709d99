"""Drives a running waygate with the official OpenAI Python client.

Usage: python openai_client.py BASE_URL API_KEY [http2]
With `http2`, the client speaks HTTP/2 without TLS (prior knowledge), as a
sidecar in a mesh does, and every check runs over it.
Exits non-zero (with the failing assertion) if the gateway does not behave
as the OpenAI API would for this client.
"""
import json
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
http2 = sys.argv[3:] == ["http2"]
http_version = "HTTP/2" if http2 else "HTTP/1.1"


def new_client(key):
    http_client = openai.DefaultHttpxClient(http1=not http2, http2=http2)
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http_client)


client = new_client(api_key)

# Non-streaming chat, over the protocol asked for.
raw = client.chat.completions.with_raw_response.create(model="fake/ok", messages=[{"role": "user", "content": "hi"}])
assert raw.http_response.http_version == http_version, raw.http_response.http_version
chat = raw.parse()
assert chat.object == "chat.completion", chat
assert chat.id.startswith("chatcmpl_"), chat.id
assert chat.model == "fake/ok", chat.model
assert chat.choices[0].message.role == "assistant"
assert chat.choices[0].message.content, chat
assert chat.choices[0].finish_reason == "stop"
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

# Streaming chat with usage.
stream = client.chat.completions.create(
    model="fake/long-5",
    messages=[{"role": "user", "content": "count"}],
    stream=True,
    stream_options={"include_usage": True},
)
chunks = list(stream)
ids = {c.id for c in chunks}
assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl_"), ids
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert len(text.split()) == 5, text
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, chunks[-1]
assert all(c.usage is None for c in chunks[:-1])

# Tool calls come back as the client expects them.
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
tool_answer = client.chat.completions.create(model="fake/tool", messages=[{"role": "user", "content": "weather?"}], tools=tools)
call = tool_answer.choices[0].message.tool_calls[0]
assert call.type == "function" and call.function.name == "get_weather", call
json.loads(call.function.arguments)
assert tool_answer.choices[0].finish_reason == "tool_calls"

# Legacy completions.
legacy = client.completions.create(model="fakechat/ok", prompt="Say hi", max_tokens=5)
assert legacy.object == "text_completion", legacy
assert legacy.id.startswith("cmpl_")
assert legacy.choices[0].text

# Models listing.
models = client.models.list()
assert [m.id for m in models.data] == ["demo/chat", "demo/spare"], models
# One model (the client sends its id percent-encoded: /models/demo%2Fchat).
model = client.models.retrieve("demo/chat")
assert (model.id, model.object, model.owned_by) == ("demo/chat", "model", "demo"), model
try:
    client.models.retrieve("demo/keyless")
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.code == "model_not_found", e.body

# Errors arrive as the client's typed exceptions with the contract's codes.
try:
    client.chat.completions.create(model="atlantis/x", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.code == "model_not_found" and e.param == "model", e.body
try:
    client.chat.completions.create(model="fake/ok", messages=[{"role": "user", "content": "hi"}], temperature=9)
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.code == "invalid_value" and e.param == "temperature", e.body
try:
    new_client("wrong").models.list()
    raise AssertionError("expected AuthenticationError")
except openai.AuthenticationError as e:
    assert e.code == "invalid_api_key", e.body
try:
    client.chat.completions.create(model="fake/status-429", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("expected RateLimitError")
except openai.RateLimitError as e:
    assert e.code == "upstream_rate_limited", e.body
    assert e.response.headers.get("retry-after") == "7"

print(f"openai client over {http_version}: all checks passed")
