# Scripted Worker A (test harness, not an agent): one test per requirement.
set -e
cd "${PROTOBOT_WORKSPACE:-/workspace}"
mkdir -p tests
cat > tests/test_dry_run.sh <<'T'
# REQ-CLI-00001: a dry run reports the planned files and writes nothing.
set -e
w=$(mktemp -d); mkdir "$w/src" "$w/dst"; echo a > "$w/src/a.txt"
out=$(sh src/sync.sh --dry-run "$w/src" "$w/dst")
echo "$out" | grep -q 'a.txt'
[ -z "$(ls -A "$w/dst")" ]
[ "$(ls -A "$w/src")" = a.txt ] && [ "$(cat "$w/src/a.txt")" = a ]
T
cat > tests/test_apply.sh <<'T'
# REQ-CLI-00002: an apply copies the planned files.
set -e
w=$(mktemp -d); mkdir "$w/src" "$w/dst"; echo a > "$w/src/a.txt"
sh src/sync.sh "$w/src" "$w/dst"
[ "$(cat "$w/dst/a.txt")" = a ]
T
cat > tests/test_refuse.sh <<'T'
# REQ-CLI-00003: a missing or non-directory destination is refused without writes.
set -e
w=$(mktemp -d); mkdir "$w/src"; echo a > "$w/src/a.txt"
# Both ways of running: an apply and a dry run.
for mode in "" --dry-run; do
  if sh src/sync.sh $mode "$w/src" "$w/missing" 2>/dev/null; then exit 1; fi
  [ ! -e "$w/missing" ]
  echo keep > "$w/file"
  if sh src/sync.sh $mode "$w/src" "$w/file" 2>/dev/null; then exit 1; fi
  [ "$(cat "$w/file")" = keep ]
  [ "$(ls -A "$w/src")" = a.txt ] && [ "$(cat "$w/src/a.txt")" = a ]
done
T
git add -A
git -c user.name=worker-a -c user.email=worker-a@protobot.invalid commit -qm "tests for REQ-CLI-00001..00003" || true
cp -a /workspace /out/worker
