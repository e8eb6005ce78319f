#!/usr/bin/env bash
# Compares the SASS of every CUDA kernel in two builds: per kernel "identical" or "differs"; exit 1 on any difference.
#
#   native/tools/compare_sass.sh BEFORE AFTER
#
# BEFORE and AFTER are each a CMake build folder (every *.cu.o under it is read), an object file, a cubin, or an
# executable or library carrying a fatbin (libtrcuda.so, the CUDA backend). Per kernel (cuobjdump -sass), the instruction stream is
# compared with its encodings (the control words hold the scheduling: stalls, barriers, yields), after the
# instruction offsets in the margin are dropped; the per-kernel resource usage (cuobjdump -res-usage: registers,
# stack, shared, local and constant memory) is compared too. Source line information is not part of that output,
# so moving code between files does not show. A kernel present in only one build differs.
# Needs cuobjdump (CUDA 12.8 or later reads sm_90 cubins); CUOBJDUMP names another one. KEEP=DIR keeps the dumps.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -eq 2 ] || usage
cuobjdump=${CUOBJDUMP:-cuobjdump}
command -v "$cuobjdump" >/dev/null || { echo "compare_sass.sh: $cuobjdump not found (set CUOBJDUMP)" >&2; exit 2; }

work=${KEEP:-$(mktemp -d)}
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

inputs() { # the files of one side
  if [ -d "$1" ]; then
    find "$1" -name '*.cu.o' -type f | sort
  elif [ -f "$1" ]; then
    echo "$1"
  else
    echo "compare_sass.sh: $1 is neither a folder nor a file" >&2
    exit 2
  fi
}

dump() { # side input-path -> $work/side/<kernel>.sass, one file per kernel
  local side=$1 src=$2 files
  mkdir -p "$work/$side"
  files=$(inputs "$src")
  [ -n "$files" ] || { echo "compare_sass.sh: no *.cu.o under $src" >&2; exit 2; }
  while IFS= read -r f; do
    # instructions: "/*0a30*/  OPCODE ... ;  /* 0x... */" then a line with the second encoding word
    "$cuobjdump" -sass "$f" | awk -v out="$work/$side" '
      /^[ \t]*Function : / { name = $3; file = out "/" name ".sass"; if (seen[name]++) dup[name] = 1; next }
      name == "" { next }
      /^[ \t]*\.headerflags/ { print "headerflags " $2 > file; next }
      /^[ \t]*\.\.\.\.\.\.\.\.\./ { next }
      /^[ \t]*\/\*[0-9a-f]+\*\// { sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, ""); gsub(/[ \t]+/, " "); print > file; next }
      /^[ \t]*\/\* 0x[0-9a-f]+ \*\/[ \t]*$/ { gsub(/[ \t]+/, " "); print > file; next }
      END { for (n in dup) print n > (out "/.duplicates") }'
    "$cuobjdump" -res-usage "$f" | awk -v out="$work/$side" '
      /^ Function [^ ]+:$/ { name = substr($2, 1, length($2) - 1); next }
      name != "" && /REG:/ { print "resources " $0 >> (out "/" name ".sass"); name = "" }'
  done <<< "$files"
  if [ -s "$work/$side/.duplicates" ]; then
    echo "compare_sass.sh: kernels defined in more than one object of $src: $(tr '\n' ' ' < "$work/$side/.duplicates")" >&2
    exit 2
  fi
}

dump a "$1"
dump b "$2"

status=0
same=0
differ=0
for name in $( (cd "$work/a" && ls -- *.sass; cd "$work/b" && ls -- *.sass) 2>/dev/null | sed 's/\.sass$//' | sort -u); do
  a="$work/a/$name.sass" b="$work/b/$name.sass"
  demangled=$(echo "$name" | c++filt 2>/dev/null || echo "$name")
  if [ ! -f "$a" ]; then
    echo "differs    $demangled (only in $2)"
  elif [ ! -f "$b" ]; then
    echo "differs    $demangled (only in $1)"
  elif cmp -s "$a" "$b"; then
    echo "identical  $demangled ($(grep -c ';' "$a") instructions)"
    same=$((same + 1))
    continue
  else
    echo "differs    $demangled ($(diff "$a" "$b" | grep -c '^<') of its dump lines changed; KEEP=DIR keeps the dumps)"
  fi
  differ=$((differ + 1))
  status=1
done
echo "$same identical, $differ differ"
exit $status
