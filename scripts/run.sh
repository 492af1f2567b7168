#!/usr/bin/env bash
# The main job: build tandem and serve its embedded default model (assets/default-model, a small
# Llama trained by tandem itself on the Brown corpus; docs/default-model.md) as an OpenAI-compatible
# API on 127.0.0.1:8000, in the foreground (Ctrl-C stops it).
#   scripts/run.sh                      build, then `tandem serve` the default model
#   scripts/run.sh serve [FLAGS]        the same with extra `tandem serve` flags (e.g. --port 8080)
#   scripts/run.sh --prompt "The" [FLAGS]   build, then just generate text (`tandem run`, e.g. -n 64
#                                       --temperature 0.8); also `scripts/run.sh run [MODEL] FLAGS`
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
# A failed build stops here, with the compiler's errors: never serve a binary left by an earlier build.
log=$(mktemp)
if ! make -C build -j2 tandem >"$log" 2>&1; then
  grep -E 'error|Error' "$log" >&2 || tail -n 40 "$log" >&2
  rm -f "$log"
  echo "run: the build failed; not starting the old build/tandem" >&2
  exit 1
fi
grep -E 'warning' "$log" >&2 || true
rm -f "$log"
[ -x build/tandem ] || { echo "run: the build failed" >&2; exit 1; }

mode=serve
case "${1:-}" in
  serve) shift ;;
  run) mode=run; shift ;;
  "") ;;
  *) for a in "$@"; do
       case "$a" in --prompt|--prompt-ids|--prompt=*|--prompt-ids=*) mode=run ;; esac
     done ;;
esac

if [ "$mode" = run ]; then
  exec build/tandem run "$@"
fi
host=127.0.0.1 port=8000
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --host) j=$((i + 1)); host="${!j:-$host}" ;;
    --port) j=$((i + 1)); port="${!j:-$port}" ;;
  esac
done
cat >&2 <<MSG
run: serving the default model on http://$host:$port (Ctrl-C to stop). Try, from another shell:
  curl -s http://$host:$port/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "default-model", "prompt": "The jury said", "max_tokens": 40, "temperature": 0.8}'
  curl -sN http://$host:$port/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "default-model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32, "stream": true}'
Just generate text instead: scripts/run.sh --prompt "The jury said" -n 64
MSG
exec build/tandem serve "$@"
