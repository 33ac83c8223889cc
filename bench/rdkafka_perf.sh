#!/usr/bin/env bash
# Prints the path of librdkafka's rdkafka_performance, building it once into
# $CACHE/librdkafka (default ~/.cache/spate-bench) from the librdkafka sources shipped in
# the rdkafka-sys crate (fetched from crates.io into cargo's registry if missing):
# ./configure without SSL, GSSAPI, curl, zstd and external lz4, then `make libs` and the
# example; several minutes on 2 cores. Prints nothing (exit 1) if the build fails.
# Used by bench/compare.sh and bench/vs_kafka.sh; RDKAFKA_PERF=path skips all of this.
set -uo pipefail
CACHE="${CACHE:-$HOME/.cache/spate-bench}"
BIN="$CACHE/librdkafka/examples/rdkafka_performance"
if [ -n "${RDKAFKA_PERF:-}" ]; then echo "$RDKAFKA_PERF"; exit 0; fi
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
sources() { ls -d "$HOME"/.cargo/registry/src/*/rdkafka-sys-*/librdkafka 2>/dev/null | tail -1; }
SRC=$(sources)
if [ -z "$SRC" ]; then
  echo "rdkafka_perf.sh: fetching rdkafka-sys sources (throwaway crate)" >&2
  T=$(mktemp -d); mkdir -p "$T/src"; echo 'fn main(){}' > "$T/src/main.rs"
  printf '[package]\nname="rdk"\nversion="0.1.0"\nedition="2021"\n[dependencies]\nrdkafka-sys="4"\n' > "$T/Cargo.toml"
  (cd "$T" && cargo fetch >&2)
  rm -rf "$T"
  SRC=$(sources)
  [ -n "$SRC" ] || { echo "rdkafka_perf.sh: no rdkafka-sys sources" >&2; exit 1; }
fi
echo "rdkafka_perf.sh: building rdkafka_performance from $SRC (several minutes on 2 cores)" >&2
mkdir -p "$CACHE"; rm -rf "$CACHE/librdkafka"; cp -r "$SRC" "$CACHE/librdkafka"
if (cd "$CACHE/librdkafka" && ./configure --disable-ssl --disable-gssapi --disable-curl --disable-zstd --disable-lz4-ext >&2 \
    && make -j"$(nproc)" libs >&2 && make -C examples rdkafka_performance >&2) && [ -x "$BIN" ]; then
  echo "$BIN"
else
  echo "rdkafka_perf.sh: the build failed" >&2
  exit 1
fi
