"""Drives a running waygate's Messages API with the official Anthropic Python client.

Usage: python anthropic_messages.py BASE_URL API_KEY
BASE_URL ends in /api/v1 (the client adds /v1/messages to its base, so it is given the
part before /v1). Every check runs through each provider API the gateway serves:
OpenAI-compatible (`fake`), Anthropic (`fakeanthropic`) and Gemini (`fakegemini`), all
fakes (tests/common). Prints "all checks passed" at the end.
"""
import base64
import json
import sys

import anthropic

base_url, api_key = sys.argv[1], sys.argv[2]
assert base_url.endswith("/v1"), base_url
client = anthropic.Anthropic(base_url=base_url[: -len("/v1")], api_key=api_key, max_retries=0)

weather = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# A 1x1 PNG.
pixel = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)).decode()

for provider in ["fake", "fakeanthropic", "fakegemini"]:
    # A plain answer: the typed Message, its text, its usage.
    message = client.messages.create(
        model=f"{provider}/ok", max_tokens=100, system="Be brief.", messages=[{"role": "user", "content": "hi"}]
    )
    assert message.type == "message" and message.role == "assistant", message
    assert message.id.startswith("msg_") and message.model == f"{provider}/ok", message
    assert message.stop_reason == "end_turn", message
    assert message.content[0].type == "text" and message.content[0].text, message
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0, message.usage

    # A stream: the SDK's typed events and its accumulated message.
    with client.messages.stream(
        model=f"{provider}/long-5", max_tokens=100, messages=[{"role": "user", "content": "count"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.split(" ") == ["word1", "word2", "word3", "word4", "word5"], text
    assert final.content[0].text == text and final.stop_reason == "end_turn", final
    assert final.usage.output_tokens == 5, final.usage

    # A tool round trip: the tool_use, then its tool_result sent back.
    asked = client.messages.create(
        model=f"{provider}/agent", max_tokens=100, tools=[weather],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert asked.stop_reason == "tool_use", asked
    use = next(block for block in asked.content if block.type == "tool_use")
    assert use.name == "get_weather" and "city" in use.input, use
    answered = client.messages.create(
        model=f"{provider}/agent", max_tokens=100, tools=[weather],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in asked.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees"}]},
        ],
    )
    assert answered.content[0].text == "The tool said: 18 degrees", answered

    # A streamed tool call: the input arrives as JSON deltas, whole in the final message.
    with client.messages.stream(
        model=f"{provider}/tool", max_tokens=100, tools=[weather],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    use = next(block for block in final.content if block.type == "tool_use")
    assert use.name == "get_weather" and use.input["city"], final

    # An image reaches the provider (`echo`: the answer is the request it received).
    seen = client.messages.create(
        model=f"{provider}/echo", max_tokens=100,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": pixel}},
            {"type": "text", "text": "What is this?"},
        ]}],
    )
    received = seen.content[0].text
    assert pixel in received and "What is this?" in received, received

# Thinking through a translated provider: Gemini's thoughts as a thinking block (the
# SDK's own type, signature empty), then streamed as thinking_delta events.
thought = client.messages.create(
    model="fakegemini/ok", max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2048},
    messages=[{"role": "user", "content": "Add 2 and 3."}],
)
assert [b.type for b in thought.content] == ["thinking", "text"], thought.content
assert thought.content[0].thinking == "Thinking within 1024 tokens." and thought.content[0].signature == "", thought
with client.messages.stream(
    model="fakegemini/ok", max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2048},
    messages=[{"role": "user", "content": "Add 2 and 3."}],
) as stream:
    thinking = "".join(e.thinking for e in stream if e.type == "thinking")
    final = stream.get_final_message()
assert thinking == "Thinking within 1024 tokens." and final.content[0].type == "thinking", (thinking, final)

# Token counting: by the provider that counts (Anthropic's count_tokens, Gemini's
# countTokens), else the gateway's estimate; each grows with the text.
short = client.messages.count_tokens(model="fakeanthropic/ok", messages=[{"role": "user", "content": "hi"}])
estimated = client.messages.count_tokens(model="fake/ok", messages=[{"role": "user", "content": "hi " * 400}])
assert short.input_tokens < estimated.input_tokens, (short, estimated)
long = client.messages.count_tokens(
    model="fakegemini/ok", system="Be brief.", tools=[weather],
    messages=[{"role": "user", "content": "hi " * 400}],
)
assert 0 < short.input_tokens < long.input_tokens, (short, long)
try:
    client.messages.count_tokens(model="atlantis/x", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("expected NotFoundError")
except anthropic.NotFoundError as e:
    assert e.body["error"]["type"] == "not_found_error", e.body

# Errors in Anthropic's envelope, as the SDK's typed exceptions.
try:
    client.messages.create(model="atlantis/x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("expected NotFoundError")
except anthropic.NotFoundError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
try:
    client.messages.create(
        model="fake/ok", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
    )
    raise AssertionError("expected BadRequestError")
except anthropic.BadRequestError as e:
    assert e.body["error"]["type"] == "invalid_request_error" and "tools.0.type" in e.body["error"]["message"], e.body
try:
    anthropic.Anthropic(base_url=base_url[: -len("/v1")], api_key="wrong", max_retries=0).messages.create(
        model="fake/ok", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    raise AssertionError("expected AuthenticationError")
except anthropic.AuthenticationError as e:
    assert e.body["error"]["type"] == "authentication_error", e.body
# A provider failing mid-stream: the SDK raises the stream's error event.
try:
    with client.messages.stream(model="fake/stream-error", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as stream:
        for _ in stream:
            pass
    raise AssertionError("expected APIStatusError")
except anthropic.APIStatusError as e:
    assert "error" in str(e).lower(), e

print("anthropic client: all checks passed")
