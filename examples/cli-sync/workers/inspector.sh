# Scripted Inspector (a test harness, not an agent): reads the candidate's
# Inspector projection and reports, as findings.jsonl, every approved
# requirement that has no test naming its behaviour's script in tests/ or no
# implementation in src/. A clean candidate yields an empty ledger entry list.
cd /workspace
: > /out/findings.jsonl
for pair in test_dry_run:REQ-CLI-00001 test_apply:REQ-CLI-00002 test_refuse:REQ-CLI-00003; do
  t=${pair%%:*}; req=${pair#*:}
  if [ ! -f "tests/$t.sh" ]; then
    printf '{"subject":"tests/%s.sh:missing","category":"coverage","severity":"major","requirement_ids":["%s"],"disposition":"test-defect","paths":["tests/%s.sh"],"summary":"no test for %s"}\n' "$t" "$req" "$t" "$req" >> /out/findings.jsonl
  fi
done
if [ -z "$(ls src 2>/dev/null)" ]; then
  printf '{"subject":"src:empty","category":"conformance","severity":"major","requirement_ids":["REQ-CLI-00001"],"disposition":"implementation-defect","paths":["src"],"summary":"no implementation"}\n' >> /out/findings.jsonl
fi
