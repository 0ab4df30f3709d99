#!/usr/bin/env python3
"""What make compose-test checks through the compose stack (scripts/compose/test.sh brings it
up; its arguments are the `docker compose ...` command that did, used to stop and start a
service and to read Redis). Standard library only: a user's `curl` and the gateways'
published ports on 127.0.0.1 are all it touches besides that.

Checked: the README's curl; a stream; a router fallback that streams (its first event long
before its last); what the provider received carries the provider's credential, never the
client's key; the dev key's requests-per-minute limit hit on both gateways at once: exactly
its limit answered, counted once in Redis; a token budget spent through one gateway refused
by the other; with the rate limit service stopped requests are still answered (fail-open),
and limits come back with it."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import subprocess
import sys
import time

GATEWAYS = [("127.0.0.1", 8080), ("127.0.0.1", 8082)]
DEV_KEY = "wg-dev-key"
# envoy/envoy.yaml's limits for the dev key.
REQUESTS_PER_MINUTE = 600


def request(gateway, body: dict, path: str = "/api/v1/chat/completions", timeout: float = 60):
    """Status, headers (lowercase names) and the whole body of one POST."""
    conn = http.client.HTTPConnection(*gateway, timeout=timeout)
    try:
        conn.request(
            "POST",
            path,
            body=json.dumps(body),
            headers={"authorization": f"Bearer {DEV_KEY}", "content-type": "application/json"},
        )
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def stream_events(gateway, body: dict):
    """Each SSE `data:` payload with the seconds since the request when its line arrived."""
    conn = http.client.HTTPConnection(*gateway, timeout=60)
    start = time.monotonic()
    try:
        conn.request(
            "POST",
            "/api/v1/chat/completions",
            body=json.dumps(body),
            headers={"authorization": f"Bearer {DEV_KEY}", "content-type": "application/json"},
        )
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        headers = {k.lower(): v for k, v in r.getheaders()}
        events = []
        for line in r:
            line = line.decode().rstrip("\r\n")
            if line.startswith("data: "):
                events.append((time.monotonic() - start, line[len("data: "):]))
        return headers, events
    finally:
        conn.close()


def ask(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def wait_until_up(compose: list[str]) -> None:
    deadline = time.monotonic() + 120
    for gateway in GATEWAYS:
        while True:
            try:
                status, _, _ = request(gateway, ask("fake/ok"), timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                subprocess.run(compose + ["logs", "--no-color", "--tail", "50"], check=False)
                raise SystemExit(f"the gateway on port {gateway[1]} did not answer in 120 s")
            time.sleep(0.5)


def redis(compose: list[str], *args: str) -> str:
    out = subprocess.run(
        compose + ["exec", "-T", "redis", "redis-cli", *args], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def reset_counts(compose: list[str]) -> None:
    """A fresh window for the dev key: the service's counters deleted (each window starts
    at its first hit, so nothing else needs to wait)."""
    keys = redis(compose, "--scan", "--pattern", "waygate-ratelimit*").split()
    if keys:
        redis(compose, "del", *keys)


def check_readme_curl() -> None:
    status, headers, body = request(GATEWAYS[0], ask("fake/ok"))
    answer = json.loads(body)
    assert status == 200, (status, body)
    assert headers.get("x-waygate-provider") == "fake", headers
    assert answer["object"] == "chat.completion", answer
    assert answer["model"] == "fake/ok", answer
    assert answer["choices"][0]["message"]["content"], answer
    print("ok: the README's curl answers (fake/ok)")


def check_stream() -> None:
    _, events = stream_events(GATEWAYS[0], ask("fake/long-20", stream=True))
    assert events and events[-1][1] == "[DONE]", events[-3:]
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or "" for _, e in events[:-1] if json.loads(e)["choices"]
    )
    assert len(text.split()) == 20, text
    print(f"ok: a stream of {len(events)} events ends with [DONE]")


def check_fallback_streams() -> None:
    # The first request to demo/fallback: provider health has not yet learned that its
    # first endpoint fails (three failures open its circuit), so this one falls back.
    headers, events = stream_events(GATEWAYS[0], ask("demo/fallback", stream=True))
    assert headers.get("x-waygate-attempts") == "fake:503,fake:200", headers
    assert events[-1][1] == "[DONE]", events[-3:]
    first, last = events[0][0], events[-1][0]
    # long-300 takes ~0.6 s to generate: the first event comes as it is generated.
    assert last - first > 0.3 and first < (last - first) / 2, (first, last)
    print(f"ok: demo/fallback falls back and streams (first event {first * 1000:.0f} ms, last {last * 1000:.0f} ms)")


def check_provider_credential_only() -> None:
    status, _, body = request(GATEWAYS[1], ask("demo/echo"))
    assert status == 200, (status, body)
    echoed = json.loads(json.loads(body)["choices"][0]["message"]["content"])
    # The provider's credential went (the filter scrubs its echo); the client's key did not.
    assert echoed["headers"].get("authorization") == "Bearer [redacted]", echoed["headers"]
    assert DEV_KEY not in body.decode(), body
    assert "x-api-key" not in echoed["headers"], echoed["headers"]
    print("ok: the provider received its own credential, never the client's key")


def check_requests_per_minute(compose: list[str]) -> None:
    reset_counts(compose)
    extra = 20
    total = REQUESTS_PER_MINUTE + extra
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        statuses = list(
            pool.map(lambda i: request(GATEWAYS[i % 2], ask("fake/ok"))[0], range(total))
        )
    served = statuses.count(200)
    refused = statuses.count(429)
    assert (served, refused) == (REQUESTS_PER_MINUTE, extra), sorted(set(statuses))
    keys = redis(compose, "--scan", "--pattern", "waygate-ratelimit*").split()
    counts = {k: redis(compose, "get", k) for k in keys}
    # The service's counter of the key's requests (`waygate_key=dev`; the tokens' is
    # `waygate_tokens=dev`).
    request_counts = [int(v) for k, v in counts.items() if ":waygate_key=dev:" in k]
    assert request_counts == [REQUESTS_PER_MINUTE], counts
    print(f"ok: {total} requests on both gateways at once: {served} answered, {refused} refused, counted once in Redis")


def check_token_budget(compose: list[str]) -> None:
    reset_counts(compose)
    # fake/long-100000 answers 100,000 words (as many completion tokens): ten spend the
    # dev key's 1,000,000 tokens a minute through the first gateway.
    for spent in range(1, 20):
        status, headers, body = request(GATEWAYS[0], ask("fake/long-100000"), timeout=120)
        if status == 429:
            break
        assert status == 200, (status, body[:300])
    else:
        raise AssertionError("the token budget was never exhausted")
    status, headers, body = request(GATEWAYS[1], ask("fake/ok"))
    assert status == 429, (status, body)
    error = json.loads(body)["error"]
    assert error["code"] == "rate_limited", error
    print(f"ok: the token budget spent through one gateway ({spent - 1} answers) is refused by the other: {error['message']}")


def check_fail_open(compose: list[str]) -> None:
    # The budget is spent (check_token_budget): refused while the service answers.
    assert request(GATEWAYS[1], ask("fake/ok"))[0] == 429
    subprocess.run(compose + ["stop", "ratelimit"], check=True, capture_output=True)
    status, _, body = request(GATEWAYS[1], ask("fake/ok"))
    assert status == 200, (status, body)
    print("ok: with the rate limit service stopped, requests are answered (fail-open)")
    subprocess.run(compose + ["start", "ratelimit"], check=True, capture_output=True)
    deadline = time.monotonic() + 30
    while request(GATEWAYS[1], ask("fake/ok"))[0] != 429:
        assert time.monotonic() < deadline, "limits did not come back within 30 s of the service"
        time.sleep(0.5)
    print("ok: limits come back with the service")


def main() -> None:
    compose = sys.argv[1:]
    wait_until_up(compose)
    check_readme_curl()
    check_stream()
    check_fallback_streams()
    check_provider_credential_only()
    check_requests_per_minute(compose)
    check_token_budget(compose)
    check_fail_open(compose)
    print("compose-test: every check passed")


if __name__ == "__main__":
    main()
