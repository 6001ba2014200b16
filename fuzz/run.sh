#!/usr/bin/env bash
# Runs every fuzz target for a bounded time from the committed seed corpora.
#
#   fuzz/run.sh                  30 s per target, as many side by side as there are cores
#   FUZZ_SECONDS=300 fuzz/run.sh longer
#   fuzz/run.sh frame            one target (any of: frame resume_token gateway_core websocket)
#
# Needs a nightly toolchain (cargo-fuzz builds with AddressSanitizer); without one it says
# so and exits 0, so CI on a stable-only machine is not failed by a missing tool. Installs
# cargo-fuzz 0.13.2 if it is missing. The corpora are copied to a scratch directory, so a
# run never dirties the tree; crashing inputs land in fuzz/artifacts/<target>/ (ignored by
# git). Exits non-zero if any target crashed, naming the input that did it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-30}"
if [[ ! "$seconds" =~ ^[0-9]+$ ]] || (( seconds < 1 )); then
    echo "FUZZ_SECONDS must be a whole number of seconds, not '$seconds'" >&2
    exit 2
fi
all_targets=(frame resume_token gateway_core websocket)
targets=("${@:-${all_targets[@]}}")

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "skipping fuzzing: no nightly toolchain ('cargo +nightly --version' failed)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "--- installing cargo-fuzz 0.13.2"
    cargo install --locked cargo-fuzz --version 0.13.2
fi

started=$(date +%s)
echo "--- building fuzz targets ($(cargo +nightly --version))"
cargo +nightly fuzz build --fuzz-dir fuzz
echo "--- built in $(( $(date +%s) - started )) s"

scratch=$(mktemp -d "${TMPDIR:-/tmp}/meridian-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# The targets run side by side, as many at a time as there are cores (FUZZ_JOBS to change
# it): each is one single-threaded libFuzzer process, so each still gets a core for its
# FUZZ_SECONDS, and the wall time is seconds x targets / cores instead of seconds x targets.
jobs="${FUZZ_JOBS:-$(nproc)}"
fuzz_one() {
    local target=$1 corpus="$scratch/corpus/$1" artifacts="fuzz/artifacts/$1"
    mkdir -p "$corpus" "$artifacts"
    cp fuzz/corpus/"$target"/* "$corpus"/
    ls "$artifacts" > "$scratch/before-$target"
    local extra=()
    if [[ "$target" == gateway_core ]]; then
        # crossbeam-epoch (the routing table) frees memory after the input that released
        # it, so LeakSanitizer would scan the heap after every input: 20x slower.
        extra+=(-detect_leaks=0)
    fi
    cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${extra[@]}" \
        > "$scratch/$target.log" 2>&1
}
# report TARGET STATUS: what the target's run printed that matters, and its crashes.
report() {
    local target=$1 status=$2 artifacts="fuzz/artifacts/$1"
    echo "--- fuzzed $target for $seconds s"
    if (( status == 0 )); then
        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
            "$scratch/$target.log" || true
        return 0
    fi
    tail -40 "$scratch/$target.log"
    local new file
    new=$(ls "$artifacts" | comm -13 "$scratch/before-$target" - || true)
    for file in $new; do
        echo "CRASH in $target: $artifacts/$file"
        echo "  replay: cargo +nightly fuzz run --fuzz-dir fuzz $target $artifacts/$file"
    done
    [[ -n "$new" ]] || echo "FAILED: $target exited non-zero without an artifact (see above)"
    return 1
}
failed=()
running=()
# wait_first: waits for the oldest running target and reports it.
wait_first() {
    local target=${running[0]} status=0
    running=("${running[@]:1}")
    wait "${pid_of[$target]}" || status=$?
    report "$target" "$status" || failed+=("$target")
}
declare -A pid_of=()
echo "--- fuzzing ${targets[*]} for $seconds s each, $jobs at a time"
for target in "${targets[@]}"; do
    (( ${#running[@]} < jobs )) || wait_first
    fuzz_one "$target" &
    pid_of[$target]=$!
    running+=("$target")
done
while (( ${#running[@]} > 0 )); do wait_first; done

echo "--- fuzzing took $(( $(date +%s) - started )) s in all"
if (( ${#failed[@]} > 0 )); then
    echo "fuzzing FAILED: ${failed[*]}"
    exit 1
fi
echo "fuzzing passed: ${targets[*]}"
