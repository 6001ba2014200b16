#!/usr/bin/env bash
# Runs every fuzz target for a bounded time from the committed seed corpora.
#
#   fuzz/run.sh                  30 s per target
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
failed=()
for target in "${targets[@]}"; do
    corpus="$scratch/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    mkdir -p "$corpus" "$artifacts"
    cp fuzz/corpus/"$target"/* "$corpus"/
    before="$scratch/before-$target"
    ls "$artifacts" > "$before"
    extra=()
    if [[ "$target" == gateway_core ]]; then
        # crossbeam-epoch (the routing table) frees memory after the input that released
        # it, so LeakSanitizer would scan the heap after every input: 20x slower.
        extra+=(-detect_leaks=0)
    fi
    echo "--- fuzzing $target for $seconds s"
    if cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${extra[@]}" \
        > "$scratch/$target.log" 2>&1; then
        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
            "$scratch/$target.log" || true
    else
        tail -40 "$scratch/$target.log"
        new=$(ls "$artifacts" | comm -13 "$before" - || true)
        for file in $new; do
            echo "CRASH in $target: $artifacts/$file"
            echo "  replay: cargo +nightly fuzz run --fuzz-dir fuzz $target $artifacts/$file"
        done
        [[ -n "$new" ]] || echo "FAILED: $target exited non-zero without an artifact (see above)"
        failed+=("$target")
    fi
done

echo "--- fuzzing took $(( $(date +%s) - started )) s in all"
if (( ${#failed[@]} > 0 )); then
    echo "fuzzing FAILED: ${failed[*]}"
    exit 1
fi
echo "fuzzing passed: ${targets[*]}"
