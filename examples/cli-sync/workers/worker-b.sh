# Scripted Worker B (test harness, not an agent): implements sync. The first
# attempt copies during a dry run (violating REQ-CLI-00001); with feedback it fixes it.
set -e
cd "${PROTOBOT_WORKSPACE:-/workspace}"
mkdir -p src
if grep -q '"feedback": \[\]' "${PROTOBOT_TASK:-/task/task.json}"; then dry_copy=yes; else dry_copy=no; fi
cat > src/sync.sh <<S
# sync [--dry-run] SRC DST: copy the files of SRC into DST.
dry=no
if [ "\$1" = --dry-run ]; then dry=yes; shift; fi
src=\$1; dst=\$2
if [ ! -d "\$dst" ]; then echo "sync: destination \$dst is missing or not a directory" >&2; exit 2; fi
(cd "\$src" && find . -type f | sed 's|^\./||' | sort)
if [ "\$dry" = yes ] && [ "$dry_copy" = no ]; then exit 0; fi
cp -R "\$src/." "\$dst/"
S
git add -A
git -c user.name=worker-b -c user.email=worker-b@protobot.invalid commit -qm "sync for REQ-CLI-00001..00003" || true
cp -a /workspace /out/worker
