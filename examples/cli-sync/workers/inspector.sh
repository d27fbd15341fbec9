# Scripted Inspector (a test harness, not an agent): reads the candidate's Inspector projection
# and reports, as findings.jsonl in the ledger's shape, (1) every approved requirement with no
# test in tests/ and (2) every observable behaviour of a requirement, error paths included, that
# src/sync.sh does not show when the Inspector runs it itself. A conformant candidate yields an
# empty file, so the inspection can seal only when every probe below passed.
ws=${PROTOBOT_WORKSPACE:-/workspace}
out=${PROTOBOT_OUT:-/out}
cd "$ws" || exit 2
findings="$out/findings.jsonl"
: > "$findings"
finding() { # subject category disposition requirement path summary
  printf '{"subject":"%s","category":"%s","severity":"major","requirement_ids":["%s"],"disposition":"%s","paths":["%s"],"summary":"%s"}\n' \
    "$1" "$2" "$4" "$3" "$5" "$6" >> "$findings"
}
for pair in test_dry_run:REQ-CLI-00001 test_apply:REQ-CLI-00002 test_refuse:REQ-CLI-00003; do
  t=${pair%%:*}; req=${pair#*:}
  if [ ! -f "tests/$t.sh" ]; then
    finding "tests/$t.sh:missing" coverage test-defect "$req" "tests/$t.sh" "no test for $req"
  fi
done
tool="$ws/src/sync.sh"
if [ ! -f "$tool" ]; then
  for req in REQ-CLI-00001 REQ-CLI-00002 REQ-CLI-00003; do
    finding "src/sync.sh:missing:$req" conformance implementation-defect "$req" src "no implementation of $req"
  done
  exit 0
fi
# A fresh project per probe: source/a.txt and an empty destination.
fresh() {
  p=$(mktemp -d "${TMPDIR:-/tmp}/inspect.XXXXXX")
  mkdir "$p/source" "$p/destination"
  echo a > "$p/source/a.txt"
}
state() { (cd "$p" && find . -print | sort && find . -type f -exec cat {} +) | cksum; }
probe() { # requirement subject summary: records a finding when the last probe failed
  finding "probe:$2" conformance implementation-defect "$1" src/sync.sh "$3"
}
# REQ-CLI-00001: a dry run reports the planned files and modifies nothing.
fresh; before=$(state)
if ! report=$(cd "$p" && sh "$tool" --dry-run source destination 2>/dev/null); then
  probe REQ-CLI-00001 dry-run-fails "a dry run of a valid source and destination exits non-zero"
fi
case "$report" in *a.txt*) ;; *) probe REQ-CLI-00001 dry-run-report "a dry run does not report the planned file a.txt" ;; esac
[ "$(state)" = "$before" ] || probe REQ-CLI-00001 dry-run-writes "a dry run modified the project"
# REQ-CLI-00002: an apply copies the planned files.
fresh
if ! (cd "$p" && sh "$tool" source destination >/dev/null 2>&1) || [ "$(cat "$p/destination/a.txt" 2>/dev/null)" != a ]; then
  probe REQ-CLI-00002 apply-copies "an apply did not copy source/a.txt into the destination"
fi
# REQ-CLI-00003: a missing or non-directory destination is refused, nothing modified, in
# both modes.
for mode in apply dry-run; do
  flag=; [ "$mode" = dry-run ] && flag=--dry-run
  fresh; rmdir "$p/destination"; before=$(state)
  if (cd "$p" && sh "$tool" $flag source destination >/dev/null 2>&1); then
    probe REQ-CLI-00003 "missing-destination-$mode-accepted" "a $mode with a missing destination exits 0"
  fi
  [ "$(state)" = "$before" ] || probe REQ-CLI-00003 "missing-destination-$mode-writes" "a $mode with a missing destination modified the project"
  fresh; rmdir "$p/destination"; echo keep > "$p/destination"; before=$(state)
  if (cd "$p" && sh "$tool" $flag source destination >/dev/null 2>&1); then
    probe REQ-CLI-00003 "file-destination-$mode-accepted" "a $mode onto a destination that is a file exits 0"
  fi
  [ "$(state)" = "$before" ] || probe REQ-CLI-00003 "file-destination-$mode-writes" "a $mode onto a destination that is a file modified the project"
done
exit 0
