#!/usr/bin/env bash
# `make fuzz`: seeds the corpora, then runs every cargo-fuzz target for FUZZ_SECONDS
# (default 30) and prints one line per target: executions, coverage (libFuzzer's `cov`
# edges and `ft` features), corpus size and crashes. A crash (or an invariant that
# failed, or an input running over 10 s) leaves its input in fuzz/artifacts/<target>/
# and makes the run fail. FUZZ_TARGETS limits the targets (space-separated).
set -uo pipefail
cd "$(dirname "$0")"

seconds=${FUZZ_SECONDS:-30}
all="config request routing build_openai build_anthropic build_gemini answer_openai
  answer_anthropic answer_gemini sse stream_openai stream_anthropic stream_gemini exchange inbound"
targets=${FUZZ_TARGETS:-$all}

./seed.sh >/dev/null
cargo +nightly fuzz build -O >/dev/null 2>&1 || cargo +nightly fuzz build -O || exit 1

dict_for() {
  case $1 in
    sse | stream_*) echo dict/stream.dict ;;
    exchange) echo dict/exchange.dict ;;
    *) echo dict/json.dict ;;
  esac
}

mkdir -p logs
failed=0
printf '%-17s %12s %10s %8s %8s %8s %8s\n' target executions exec/s cov ft corpus crashes
for t in $targets; do
  log=logs/$t.log
  cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -max_len=8192 -dict="$(dict_for "$t")" -print_final_stats=1 >"$log" 2>&1
  status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  crashes=0
  if [ "$status" -ne 0 ]; then
    crashes=$(ls "artifacts/$t" 2>/dev/null | wc -l)
    [ "$crashes" -eq 0 ] && crashes=1
    failed=1
  fi
  printf '%-17s %12s %10s %8s %8s %8s %8s\n' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
  if [ "$status" -ne 0 ]; then
    grep -E 'panicked|SUMMARY|Test unit written|ERROR' "$log" | head -5 | sed 's/^/    /'
  fi
done
[ "$failed" -eq 0 ] || { echo "fuzz: crashes found (inputs in fuzz/artifacts/, logs in fuzz/logs/)"; exit 1; }
