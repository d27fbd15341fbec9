# VIS-CLI-00001 (REQ-CLI-00001), the evaluation corpus's worker-visible check of the cli-sync
# fixture, made executable: "Dry-run lists planned relative paths and leaves the destination
# digest unchanged." Setup: a project tree with source/a.txt and an empty destination directory.
# Evidence: exit status 0, stdout contains a.txt, the destination's digest equals the pre-run one.
# Run by `protobot eval` (and `protobot demo`) in the merged product's root, in a sandbox; exit 0
# means the check passed, and the last line says what was observed.
product=$(pwd)
p=$(mktemp -d "${TMPDIR:-/tmp}/vis-cli-00001.XXXXXX")
mkdir "$p/source" "$p/destination"
echo a > "$p/source/a.txt"
digest() { (cd "$p/destination" && find . -print | sort && find . -type f -exec cat {} +) | cksum; }
before=$(digest)
report=$(cd "$p" && sh "$product/src/sync.sh" --dry-run source destination 2>&1)
status=$?
after=$(digest)
verdict=pass
[ "$status" = 0 ] || verdict=fail
case "$report" in *a.txt*) listed=yes ;; *) listed=no; verdict=fail ;; esac
[ "$before" = "$after" ] && unchanged=yes || { unchanged=no; verdict=fail; }
echo "VIS-CLI-00001 $verdict: exit status $status, stdout lists a.txt: $listed, destination digest unchanged: $unchanged"
[ "$verdict" = pass ]
