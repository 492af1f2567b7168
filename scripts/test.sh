#!/usr/bin/env bash
# The whole test suite, as CI runs it: setup, build, oracles, unit + integration tests, the same
# tests under ASan+UBSan, and every fuzz target for a bounded time.
#   FUZZ_SECONDS (default 30) per fuzz target; SKIP_ASAN=1 / SKIP_FUZZ=1 for quick local runs.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test || exit 1

PY=/usr/bin/python3
JOBS=${JOBS:-2}
export TANDEM_TEST_DATA=${TANDEM_TEST_DATA:-$PWD/.cache}
mkdir -p "$TANDEM_TEST_DATA"
failed=0 passed=0
skipped=""  # "DIR: test test ..." lines: tests that exited 77 (could not run on this machine)
step() {  # step NAME CMD...: runs a stage, counts it
  local name=$1; shift
  echo "=== $name"
  if "$@"; then passed=$((passed + 1)); else echo "*** FAILED: $name"; failed=$((failed + 1)); fi
}

# ctest that fails when no test is registered (a build directory whose cached options register none),
# prints how many ran, and collects the skipped ones (exit 77, SKIP_RETURN_CODE) for the summary.
run_ctest() {  # run_ctest DIR [ctest args...]
  local dir=$1; shift
  local n
  n=$(ctest --test-dir "$dir" -N "$@" | sed -n 's/^Total Tests: *//p')
  echo "($dir: ${n:-0} tests registered)"
  [ "${n:-0}" -gt 0 ] || { echo "no tests registered in $dir: its CMake cache registers none (TANDEM_FUZZ?)"; return 1; }
  local log="$dir/ctest.log" rc s
  ctest --test-dir "$dir" --output-on-failure --no-tests=error "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  s=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$log" | tr '\n' ' ')
  [ -z "$s" ] || skipped="$skipped  $dir: $s"$'\n'
  return "$rc"
}

build() {  # build DIR [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  grep 'tandem:' "$dir.configure.log" | sed 's/^-- //'
  make -C "$dir" -j"$JOBS" 2>&1 | grep -E 'warning|error' ; test "${PIPESTATUS[0]}" = 0
}

oracles() {
  for gen in tests/oracle/gen/*.sh; do
    [ -e "$gen" ] || continue
    bash "$gen" || { echo "oracle generator failed: $gen"; return 1; }
  done
}

step "build (release)" build build -DCMAKE_BUILD_TYPE=Release -DTANDEM_FUZZ=OFF -DTANDEM_SANITIZE=OFF
step "oracles (PyTorch, Hugging Face tokenizers, Jinja)" oracles
step "tests (release)" run_ctest build -j"$JOBS"

if [ "${SKIP_ASAN:-0}" != 1 ]; then
  step "build (ASan+UBSan)" build build-asan -DCMAKE_BUILD_TYPE=Debug -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DTANDEM_FUZZ=OFF
  asan_tests() { ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 run_ctest build-asan -j"$JOBS" -L unit; }
  step "tests (ASan+UBSan)" asan_tests
fi

if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  fuzz() {
    CC=clang CXX=clang++ build build-fuzz -DCMAKE_BUILD_TYPE=Debug -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF || return 1
    local rc=0 ran=0
    for f in build-fuzz/fuzz_*; do
      [ -x "$f" ] || continue
      ran=$((ran + 1))
      local name; name=$(basename "$f"); local corpus=tests/fuzz/corpus/${name#fuzz_}
      local work=build-fuzz/corpus-${name#fuzz_}; mkdir -p "$work"
      echo "--- $name (${FUZZ_SECONDS:-30} s, seeds: $corpus)"
      "$f" -max_total_time="${FUZZ_SECONDS:-30}" -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix=build-fuzz/"$name"- "$work" "$corpus" >"build-fuzz/$name.log" 2>&1 \
        || { tail -n 40 "build-fuzz/$name.log"; rc=1; }
      grep -E '^(#[0-9]+\s+DONE|Done)' "build-fuzz/$name.log" | tail -n 1
    done
    [ "$ran" -gt 0 ] || { echo "no fuzz target was built"; return 1; }
    echo "($ran fuzz targets ran)"
    return $rc
  }
  step "fuzz" fuzz
fi

echo
echo "test stages: $passed passed, $failed failed"
if [ -n "$skipped" ]; then
  echo "skipped tests (exit 77: a device, an optional build part or a CPU feature this machine lacks):"
  printf '%s' "$skipped"
else
  echo "skipped tests: none"
fi
[ $failed = 0 ]
