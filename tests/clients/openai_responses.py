"""Drives a running waygate's Responses API with the official OpenAI Python client.

Usage: python openai_responses.py BASE_URL API_KEY
Every check runs through each provider API the gateway translates to: OpenAI-compatible
(`fake`), Anthropic (`fakeanthropic`) and Gemini (`fakegemini`), all fakes (tests/common).
Exits non-zero (with the failing assertion) if the gateway does not behave as the
Responses API would for this client; prints "all checks passed" at the end.
"""
import json
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

weather = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

for provider in ["fake", "fakeanthropic", "fakegemini"]:
    # A plain answer: the typed Response, its text, its usage.
    response = client.responses.create(model=f"{provider}/ok", input="hi", instructions="Be brief.")
    assert response.object == "response" and response.id.startswith("resp_"), response
    assert response.status == "completed" and response.model == f"{provider}/ok", response
    assert response.output_text, response
    assert response.instructions == "Be brief."
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens > 0, response.usage

    # A stream: the SDK's typed events, the text as its deltas, the final response.
    with client.responses.stream(model=f"{provider}/long-5", input="count") as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response.completed", types
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas.split(" ") == ["word1", "word2", "word3", "word4", "word5"], deltas
    assert final.output_text == deltas and final.usage.output_tokens == 5, final
    assert final.id == events[0].response.id, (final.id, events[0].response.id)

    # A function tool round trip: the call, then its output sent back.
    asked = client.responses.create(model=f"{provider}/tool", input="Weather in Paris?", tools=[weather])
    calls = [item for item in asked.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", asked.output
    assert "city" in json.loads(calls[0].arguments), calls[0].arguments
    follow_up = [
        {"role": "user", "content": "Weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in asked.output],
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, sunny"},
    ]
    # `echo`: the provider's answer is the request it received, in its own API.
    answered = client.responses.create(model=f"{provider}/echo", input=follow_up, tools=[weather])
    received = answered.output_text
    assert "18 degrees, sunny" in received and "get_weather" in received, received
    if provider != "fakegemini":  # Gemini's API pairs a call and its result by name, not by id.
        assert calls[0].call_id in received, received

    # A streamed tool call: the arguments arrive as deltas, the item complete at the end.
    with client.responses.stream(model=f"{provider}/tool", input="Weather in Paris?", tools=[weather]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "function_call")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == call.arguments and json.loads(arguments)["city"], (arguments, call)

# Structured output, through the SDK's own parse helper.
parsed = client.responses.create(
    model="fake/json",
    input="A JSON object, please.",
    text={"format": {"type": "json_object"}},
)
assert isinstance(json.loads(parsed.output_text), dict), parsed.output_text

# A provider failing mid-stream: the stream says so (response.failed), never a silent end.
with client.responses.stream(model="fake/stream-error", input="hi") as stream:
    types = [e.type for e in stream]
assert types[-2:] == ["error", "response.failed"], types

# What needs state the gateway does not keep, or a tool the provider runs: a 400 naming it.
for kwargs, param in [
    ({"previous_response_id": "resp_earlier"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"conversation": "conv_1"}, "conversation"),
]:
    try:
        client.responses.create(model="fake/ok", input="hi", **kwargs)
        raise AssertionError(f"expected BadRequestError for {param}")
    except openai.BadRequestError as e:
        assert e.code == "unsupported_parameter" and e.param == param, e.body

# The client's typed errors, as on chat.
try:
    client.responses.create(model="atlantis/x", input="hi")
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.code == "model_not_found" and e.param == "model", e.body

print("openai responses client: all checks passed")
