#!/usr/bin/env bash
# Installs what tandem needs on a fresh Debian machine; quiet and quick when everything is present.
#   scripts/setup.sh          build dependencies only
#   scripts/setup.sh --test   also the test oracles (PyTorch, numpy, clang for fuzzing, npm packages)
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

pkgs=(cmake make gcc pkg-config libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libxxhash-dev zlib1g-dev libcurl4-openssl-dev libdnnl-dev
      ocl-icd-opencl-dev opencl-headers libopenmpi-dev openmpi-bin)
if [ $want_test = 1 ]; then
  # pocl-opencl-icd: OpenCL on the CPU, so the opencl backend's tests run without a device.
  # openssl: the CLI makes the https test's certificate.
  pkgs+=(python3 python3-torch python3-numpy clang libclang-rt-14-dev pocl-opencl-icd openssl)
  # Node.js may come from elsewhere than Debian (with npm bundled): only install what is missing.
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v npm >/dev/null || pkgs+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ $want_test = 1 ]; then
  stamp=tests/oracle/node_modules/.tandem-lock
  if [ ! -f "$stamp" ] || ! cmp -s tests/oracle/package-lock.json "$stamp"; then
    echo "setup: installing npm test oracles (tests/oracle)"
    npm ci --prefix tests/oracle --no-audit --no-fund --loglevel=error >/dev/null
    cp tests/oracle/package-lock.json "$stamp"
  fi
fi
