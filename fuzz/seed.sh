#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ from tests/fixtures, benches/data and a few client requests
# written out below. Idempotent (re-running rewrites the same files); the corpora are not
# committed (fuzz/.gitignore), and libFuzzer adds what it finds next to the seeds.
#
# Input layouts (see fuzz/src/lib.rs): answer targets take one request-selector byte, then
# the body; stream targets a selector byte, a chunk-plan byte (0 = one chunk), then the
# bytes; sse a chunk-plan byte, then the bytes; build targets an operation byte (0 = chat,
# 1 = legacy), then the client's body.
set -euo pipefail
cd "$(dirname "$0")"
fx=../tests/fixtures
c=corpus

targets="config request routing build_openai build_anthropic build_gemini answer_openai
  answer_anthropic answer_gemini sse stream_openai stream_anthropic stream_gemini exchange inbound"
for t in $targets; do mkdir -p "$c/$t"; done

# seed <target> <name> <prefix as printf escapes> <file>
seed() { { printf "$3"; cat "$4"; } > "$c/$1/$2"; }

# Client requests (OpenAI shape): recorded ones, the bench body, and hand-written shapes
# that reach every translator branch (images, tools, tool results, JSON modes, legacy).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$fx/openai/chat_completion_tool_calls.request.json" "$tmp/chat_tools.json"
cp ../benches/data/chat_1k.json "$tmp/chat_1k.json"
cat > "$tmp/chat_parts.json" <<'EOF'
{"model":"oa/gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"developer","content":"JSON"},{"role":"user","content":[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]},{"role":"assistant","content":"A cat."},{"role":"user","content":"More."}],"max_tokens":50,"temperature":1.5,"top_p":0.9,"stop":["END","STOP"],"seed":12345678901,"presence_penalty":0.5,"frequency_penalty":-0.5,"user":"u-1","stream":true,"stream_options":{"include_usage":true}}
EOF
cat > "$tmp/chat_tool_turns.json" <<'EOF'
{"model":"ge/gemini-3-pro","messages":[{"role":"user","content":"Weather in Paris and Rome?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_r_1_c2lnbmF0dXJl","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"{\"temp\":21}"},{"role":"tool","tool_call_id":"call_r_1_c2lnbmF0dXJl","content":"sunny"}],"tools":[{"type":"function","function":{"name":"weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":{"type":"function","function":{"name":"weather"}},"parallel_tool_calls":false,"n":2}
EOF
cat > "$tmp/chat_json_schema.json" <<'EOF'
{"model":"an/claude","messages":[{"role":"user","content":"Give me a person."},{"role":"assistant","content":"{\"name\": "}],"response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}},"max_completion_tokens":100,"waygate":{"routing":{"prefer":["an","oa"],"allow_fallbacks":true,"max_provider_tries":2}}}
EOF
cat > "$tmp/chat_json_object.json" <<'EOF'
{"model":"chain/x","messages":[{"role":"user","content":"JSON please"}],"response_format":{"type":"json_object"},"tool_choice":"required","tools":[{"type":"function","function":{"name":"f"}}],"logit_bias":{"50256":-100},"store":false,"waygate":{"routing":{"prefer":["ge"],"allow_fallbacks":false}}}
EOF
cat > "$tmp/legacy.json" <<'EOF'
{"model":"lg/gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7,"temperature":0,"echo":false,"stream":true,"waygate":{"routing":{"max_provider_tries":1}}}
EOF

for f in "$tmp"/*.json; do
  name=$(basename "$f" .json)
  seed request "$name" '' "$f"
  seed routing "$name" '' "$f"
  op='\x00'
  case $name in legacy*) op='\x01' ;; esac
  for t in build_openai build_anthropic build_gemini; do seed "$t" "$name" "$op" "$f"; done
  seed exchange "req_$name" '' "$f"
done
for f in "$fx"/*/*.request.json; do
  name=$(basename "$(dirname "$f")")_$(basename "$f" .json)
  seed request "$name" '' "$f"
  for t in build_openai build_anthropic build_gemini; do seed "$t" "$name" '\x00' "$f"; done
done

# Plugin configurations: the bench's and the one in envoy/local.yaml.
seed config bench '' ../benches/data/plugin.json
sed -n '/value: |/,/vm_config:/p' ../envoy/local.yaml | sed '1d;$d' > "$c/config/local_yaml"

# Answers and error bodies: chat selector (0x03: json_object, 0x05: tools), legacy (0x02).
for api in openai anthropic gemini; do
  for f in "$fx/$api"/*.json; do
    case $f in *.request.json) continue ;; esac
    name=$(basename "$f" .json)
    seed "answer_$api" "$name" '\x00' "$f"
    seed "answer_$api" "${name}_tools" '\x05' "$f"
    seed "answer_$api" "${name}_json" '\x03' "$f"
    case $name in completion*) seed "answer_$api" "${name}_legacy" '\x02' "$f" ;; esac
    seed exchange "${api}_$name" '' "$f"
  done
  # Streams: chat (0x00), usage asked (0x01), legacy (0x02); one chunk.
  for f in "$fx/$api"/*.sse; do
    name=$(basename "$f" .sse)
    seed "stream_$api" "$name" '\x00\x00' "$f"
    seed "stream_$api" "${name}_usage" '\x01\x00' "$f"
    seed "stream_$api" "${name}_legacy" '\x02\x00' "$f"
    seed "stream_$api" "${name}_redacted" '\x80\x00' "$f"
    seed sse "${api}_$name" '\x00' "$f"
  done
done

# A stream whose content splits the secret the stream targets scrub (selector bit 7).
secret=sk-stream-secret-42
for cut in 2 6 18; do
  printf '\x80\x00data: {"choices":[{"index":0,"delta":{"content":"key %s"}}]}\n\ndata: {"choices":[{"index":0,"delta":{"content":"%s!"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n' \
    "${secret:0:$cut}" "${secret:$cut}" > "$c/stream_openai/split_secret_$cut"
done

# inbound: an API selector (0 Responses, 1 Messages, 2 count; +4 Gemini's stream), a
# chunk-plan byte, the client's request, 0xff, then the provider's answer or stream.
inbound() { { printf "$2"; cat "$3"; printf '\xff'; cat "$4"; } > "$c/inbound/$1"; }
responses_request='{"model":"oa/gpt-5","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Weather?"}]},{"type":"function_call","call_id":"c1","name":"weather","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"sunny"}],"tools":[{"type":"function","name":"weather","parameters":{"type":"object"}}],"stream":true,"text":{"format":{"type":"json_object"}},"reasoning":{"effort":"low"}}'
printf '%s' "$responses_request" > "$tmp/responses.json"
inbound responses_openai '\x00\x00' "$tmp/responses.json" "$fx/openai/chat_completion_stream_parallel_tool_calls.sse"
inbound responses_answer '\x00\x00' "$tmp/responses.json" "$fx/openai/chat_completion_tool_calls.json"
inbound messages_openai '\x01\x00' "$fx/anthropic/message_tool_result.request.json" "$fx/openai/chat_completion_stream.sse"
inbound messages_gemini '\x05\x00' "$fx/anthropic/message_tool_use.request.json" "$fx/gemini/stream_generate_content_thoughts.sse"
inbound count '\x02\x00' "$fx/anthropic/message.request.json" "$fx/openai/chat_completion.json"

# Inputs that once failed (each has a named regression test in src/, or a note in
# src/lib.rs where the harness was wrong), replayed as seeds.
for dir in regressions/*/; do
  t=$(basename "$dir")
  for f in "$dir"*; do cp "$f" "$c/$t/regression_$(basename "$f")"; done
done

for t in $targets; do printf '%s: %s seeds\n' "$t" "$(ls "$c/$t" | wc -l)"; done
