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
# Every type the library uses must be one of .NET Standard 2.0 (what Unity and Godot load):
# the type references of the DLL against the types mono's netstandard facade forwards.
netstandard=/usr/lib/mono/4.7.1-api/Facades/netstandard.dll
if command -v monodis >/dev/null 2>&1 && [ -f "$netstandard" ]; then
  outside=$(comm -23 \
    <(monodis --typeref bin/Meridian.Client.dll | sed -n 's/^[0-9]*: \[[^]]*\]//p' | sed 's|/.*||' | sort -u) \
    <(monodis --exported "$netstandard" | sed -n 's/^[0-9]*: \([^ ]*\) is in.*/\1/p' | sort -u))
  if [ -n "$outside" ]; then
    echo "build.sh: Meridian.Client.dll uses types outside .NET Standard 2.0:" >&2
    echo "$outside" >&2
    exit 1
  fi
  echo "every type Meridian.Client.dll uses is in .NET Standard 2.0"
fi
echo "built into $here/bin: Meridian.Client.dll, Meridian.Client.Tests.exe, Bot.exe ($csc)"
