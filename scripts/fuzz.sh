#!/usr/bin/env bash
# Runs the libFuzzer harnesses of fuzz/ built in BUILD_DIR (scripts/sanitize.sh builds them, with ASan and UBSan), as
# many at a time as there are cores: each replays its committed corpus (fuzz/corpus/<name>/), then fuzzes for
# SECONDS (default 30), new inputs kept in BUILD_DIR/fuzz-work/<name>/ (the committed corpus is not touched). A
# crash, a sanitizer report, a leak, an input slower than 25 s or a failed check of the harness fails the run: the
# input is saved as BUILD_DIR/fuzz-artifacts/<name>-crash-<sha1> and printed in base64 (so that a CI log holds it),
# exit status 1.
#   scripts/fuzz.sh BUILD_DIR [SECONDS] [NAME...]     (SECONDS 0: only replay the corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS] [NAME...]}"
seconds="${2:-30}"
shift $(($# >= 2 ? 2 : 1))
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(safetensors sharded_index layout npy strict_json train_checkpoint parse_number)
case "$seconds" in '' | *[!0-9]*)
  echo "scripts/fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2
  exit 2
  ;;
esac
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts" "$build/fuzz-work"
for name in "${names[@]}"; do
  if [ ! -x "$build/fuzz/fuzz_$name" ] || [ ! -d "fuzz/corpus/$name" ]; then
    echo "scripts/fuzz.sh: no harness $build/fuzz/fuzz_$name or corpus fuzz/corpus/$name (build with" \
      "scripts/sanitize.sh; names: safetensors sharded_index layout npy strict_json train_checkpoint parse_number)" >&2
    exit 2
  fi
done

# One harness: its log in fuzz-work/NAME.log, its one-line summary in fuzz-work/NAME.result.
fuzz_one() {
  local name="$1" harness="$build/fuzz/fuzz_$1" corpus="fuzz/corpus/$1" work="$build/fuzz-work/$1"
  local log="$build/fuzz-work/$1.log" status=0 start execs
  mkdir -p "$work"
  rm -f "$artifacts/$name"-*  # what an earlier run found is not this run's finding
  local flags=(-max_len=65536 -timeout=25 -rss_limit_mb=4096 -print_final_stats=1 "-artifact_prefix=$artifacts/$name-")
  start=$(date +%s)
  if [ "$seconds" -eq 0 ]; then
    "$harness" "${flags[@]}" -runs=0 "$corpus" >"$log" 2>&1 || status=$?
  else
    "$harness" "${flags[@]}" -max_total_time="$seconds" "$work" "$corpus" >"$log" 2>&1 || status=$?
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "fuzz_$name: $(ls "$corpus" | wc -l) corpus inputs replayed, ${execs:-0} runs in $(($(date +%s) - start)) s:" \
    "$([ $status -eq 0 ] && echo ok || echo "FAILED (status $status)")" >"$build/fuzz-work/$name.result"
  return $status
}

# As many harnesses at a time as there are cores (each runs on one).
jobs_max=$(nproc)
for name in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  rm -f "$build/fuzz-work/$name.result"
  fuzz_one "$name" &
done
wait || true

failed=()
for name in "${names[@]}"; do
  result="$build/fuzz-work/$name.result"
  cat "$result" 2>/dev/null || echo "fuzz_$name: FAILED (no result)"
  grep -q ': ok$' "$result" 2>/dev/null && continue
  failed+=("$name")
  grep -a -E 'ERROR|fuzz finding|SUMMARY|runtime error|==[0-9]+==' "$build/fuzz-work/$name.log" | head -20 >&2 || true
  for f in "$artifacts/$name"-*; do
    [ -f "$f" ] || continue
    echo "reproducer $f (base64; replay: $build/fuzz/fuzz_$name $f):" >&2
    head -c 65536 "$f" | base64 >&2
  done
  echo "full log: $build/fuzz-work/$name.log" >&2
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "scripts/fuzz.sh: failed: ${failed[*]}" >&2
  exit 1
fi
