#!/usr/bin/env bash
# tools/mirror_worktree.sh DEST: mirror this checkout's source files (tracked
# and untracked, not ignored; what `git status` would show) into DEST, keeping
# modification times so that a build in DEST stays incremental. Files mirrored
# by an earlier run and gone from the checkout since are removed from DEST.
set -euo pipefail
dest="$1"
mkdir -p "$dest"
list="$(mktemp)"
trap 'rm -f "$list"' EXIT
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done >"$list"
if [ -f "$dest/.mirrored-files" ]; then
  comm -z -23 <(sort -z "$dest/.mirrored-files") <(sort -z "$list") |
    (cd "$dest" && xargs -0 -r rm -f --)
fi
tar --null -T "$list" -cf - | tar -xpf - -C "$dest"
cp "$list" "$dest/.mirrored-files"
