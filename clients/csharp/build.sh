#!/usr/bin/env bash
# Builds the C# client library, its tests and the example bot into clients/csharp/bin/ with
# mono's C# compiler (Debian's mono-complete: `csc` where Roslyn is installed, else
# `mono-csc`/`mcs`). Then: `mono bin/Meridian.Client.Tests.exe unit` (no server needed) or
# `MERIDIAN_BIN=target/debug/meridian mono bin/Meridian.Client.Tests.exe all`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
csc=""
for candidate in csc mono-csc mcs; do
  if command -v "$candidate" >/dev/null 2>&1; then csc="$candidate"; break; fi
done
if [ -z "$csc" ]; then
  echo "build.sh: no C# compiler (csc, mono-csc or mcs): apt-get install mono-complete" >&2
  exit 1
fi
mkdir -p bin
# CS1591 (a public member without a doc comment) stays a warning: self-describing fields
# such as Position.X go without one.
common=(-nologo -warnaserror+ -nowarn:1591 -debug)
"$csc" "${common[@]}" -target:library -doc:bin/Meridian.Client.xml -out:bin/Meridian.Client.dll src/*.cs
"$csc" "${common[@]}" -target:exe -r:bin/Meridian.Client.dll -out:bin/Meridian.Client.Tests.exe tests/*.cs
"$csc" "${common[@]}" -target:exe -r:bin/Meridian.Client.dll -out:bin/Bot.exe examples/Bot/*.cs
echo "built into $here/bin: Meridian.Client.dll, Meridian.Client.Tests.exe, Bot.exe ($csc)"
