# The reasons of a failed `go test -v` run, for CI's digest: for each test
# that failed, the headline of each line it logged (file:line: message,
# without continuation lines), at most `maxlines` per test. CI keeps only
# the tail of the output, so a failing subtest's t.Errorf must be here.
#
#   awk -v maxlines=12 -f .ci/digest.awk LOG LOG
#
# The log is read twice: the first pass collects the failing names.
FNR == NR {
  if (match($0, /--- FAIL: [^ ]+/)) failed[substr($0, RSTART + 10, RLENGTH - 10)] = 1
  next
}
/^=== (RUN|NAME|CONT|PAUSE) / { cur = $3; next }
# Without -v a failing test's lines follow its "--- FAIL" line.
match($0, /^ *--- FAIL: [^ ]+/) { cur = substr($0, RSTART, RLENGTH); sub(/^ *--- FAIL: /, "", cur); next }
/^ *--- (PASS|SKIP):/ || /^(ok|FAIL|PASS|panic:)/ { cur = ""; next }
cur in failed && /^ +[A-Za-z0-9_]+\.go:[0-9]+: / {
  if (n[cur]++ == 0) print "-- " cur ":"
  if (n[cur] <= maxlines) print substr($0, 1, 400)
}
