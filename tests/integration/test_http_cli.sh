#!/usr/bin/env bash
# quantctl's job commands against a real redis-server and the HTTP API (served by the
# test_http binary's --serve mode): submit (flags, file, Redis, HTTP), list, status, cancel,
# watch following a job to done, and the exit codes. Skips (77) without redis-server.
set -euo pipefail
B=${QUANTD_BUILD_DIR:?}
Q=$B/quantctl
command -v redis-server >/dev/null || { echo "no redis-server; skipping" >&2; exit 77; }
tmp=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(port); HP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --loglevel warning >/dev/null &
RPID=$!
SPID=
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; kill "$RPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
R="redis-cli -p $RP"
for _ in $(seq 50); do $R ping >/dev/null 2>&1 && break; sleep 0.1; done
"$B/tests/test_http" --serve "$HP" "$RP" 2>"$tmp/serve.log" &
SPID=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$HP/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
export QUANTD_REDIS=redis://127.0.0.1:$RP
fail() { echo "test_http_cli: $*" >&2; exit 1; }

"$Q" submit --help | grep -q 'usage: quantctl submit' || fail "submit --help"
for c in status watch cancel list; do "$Q" $c --help | grep -q "usage: quantctl $c" || fail "$c --help"; done

# Invalid jobs are refused with 2 and never queued.
set +e; "$Q" submit --model /m --output /o --method rtn --bits 5 2>"$tmp/err"; rc=$?; set -e
[ $rc -eq 2 ] || fail "invalid submit exit $rc"
grep -q bits "$tmp/err" || fail "invalid submit message: $(cat "$tmp/err")"
[ "$($R llen qjobs)" = 0 ] || fail "an invalid job was queued"

id=$("$Q" submit --model /m --output /o/a --method rtn --bits 4)
[[ $id == j-* ]] || fail "submit printed '$id'"
$R lindex qjobs 0 | grep -q "\"id\":\"$id\"" || fail "queued payload lacks the id"
echo '{"model":"/m","output":"/o/b","method":"rtn","id":"from-file"}' > "$tmp/job.json"
[ "$("$Q" submit "$tmp/job.json")" = from-file ] || fail "submit FILE"
# Over HTTP: needs the token (test_http --serve uses s3cret).
set +e; "$Q" submit --http "http://127.0.0.1:$HP" --model /m --output /o/c --method rtn 2>"$tmp/err"; rc=$?; set -e
[ $rc -eq 1 ] || fail "HTTP submit without token exit $rc"
grep -q "401" "$tmp/err" || fail "no 401: $(cat "$tmp/err")"
[ "$("$Q" submit --http "http://127.0.0.1:$HP" --token s3cret --id via-http --model /m --output /o/c --method rtn)" = via-http ] \
  || fail "HTTP submit"
[ "$($R llen qjobs)" = 3 ] || fail "queue length $($R llen qjobs)"

# A job in flight, written the way the daemon writes it.
$R hset qjob:w1 v 1 id w1 state running progress 0.1 stage quantize block 0 blocks 3 >/dev/null
$R zadd qjobs:index 1 w1 >/dev/null
ev() { $R xadd qjob:w1:events '*' event "{\"v\":1,\"type\":\"progress\",\"id\":\"w1\",\"state\":\"$1\",\"progress\":$2,\"block\":$3,\"blocks\":3}" >/dev/null; }
ev running 0.1 0
"$Q" list | grep -q '^w1 .*running' || fail "list"
"$Q" list --http "http://127.0.0.1:$HP" | grep -q '^w1 .*running' || fail "list over HTTP"
[ -z "$("$Q" list --state done)" ] || fail "list --state done"
"$Q" status w1 | grep -q 'state: *running' || fail "status"
"$Q" status w1 --http "http://127.0.0.1:$HP" | grep -q 'progress: *10.0%' || fail "status over HTTP"
set +e; "$Q" status nope 2>/dev/null; rc=$?; set -e
[ $rc -eq 1 ] || fail "status of an unknown job exit $rc"

( sleep 0.5; ev running 0.5 1; sleep 0.5; ev running 0.9 2; sleep 0.3; ev done 1 2 ) &
"$Q" watch w1 --timeout 20 > "$tmp/watch.out" || fail "watch exit $?"
grep -q 'progress=0.5000' "$tmp/watch.out" || fail "watch missed an event: $(cat "$tmp/watch.out")"
tail -1 "$tmp/watch.out" | grep -q 'state=done' || fail "watch did not end on done"
$R hset qjob:w1 state done >/dev/null

# watch of a job no daemon has taken yet: without --timeout an unknown id is refused at once;
# with it, watch waits for the status to appear, then follows the job (w5 appears after a
# moment, as when a daemon takes a job pushed with LPUSH).
set +e; "$Q" watch w5 2>"$tmp/err"; rc=$?; set -e
[ $rc -eq 1 ] && grep -q "no job 'w5'" "$tmp/err" || fail "watch of an unknown job without --timeout: exit $rc, $(cat "$tmp/err")"
( sleep 1.5; $R hset qjob:w5 v 1 id w5 state running >/dev/null
  $R xadd qjob:w5:events '*' event '{"v":1,"type":"state","id":"w5","state":"done","progress":1,"block":0,"blocks":1}' >/dev/null ) &
late=$!
"$Q" watch w5 --timeout 20 > "$tmp/watch5.out" || fail "watch --timeout of a job not taken yet: exit $?"
tail -1 "$tmp/watch5.out" | grep -q 'state=done' || fail "watch of a late job did not end on done: $(cat "$tmp/watch5.out")"
wait "$late"

# watch over HTTP: the API's Server-Sent Events (replay of w4's stream, then live events).
$R hset qjob:w4 v 1 id w4 state running progress 0.1 stage quantize block 0 blocks 3 >/dev/null
ev4() { $R xadd qjob:w4:events '*' event "{\"v\":1,\"type\":\"progress\",\"id\":\"w4\",\"state\":\"$1\",\"progress\":$2,\"block\":$3,\"blocks\":3}" >/dev/null; $R publish qjobs:events "{\"v\":1,\"id\":\"w4\"}" >/dev/null; }
ev4 running 0.1 0
( sleep 0.5; ev4 running 0.6 1; sleep 0.5; ev4 done 1 2 ) &
"$Q" watch w4 --http "http://127.0.0.1:$HP" --timeout 20 > "$tmp/watch4.out" || fail "watch --http exit $?: $(cat "$tmp/watch4.out")"
grep -q 'progress=0.6000' "$tmp/watch4.out" || fail "watch --http missed an event: $(cat "$tmp/watch4.out")"
tail -1 "$tmp/watch4.out" | grep -q 'state=done' || fail "watch --http did not end on done"
set +e; "$Q" watch nope --http "http://127.0.0.1:$HP" --timeout 5 2>"$tmp/err"; rc=$?; set -e
[ $rc -eq 1 ] && grep -q 404 "$tmp/err" || fail "watch --http of an unknown job: exit $rc, $(cat "$tmp/err")"

# Cancel: flag + notification; a finished job refuses.
$R hset qjob:w2 v 1 id w2 state running >/dev/null
"$Q" cancel w2 >/dev/null || fail "cancel"
[ "$($R exists qjob:w2:cancel)" = 1 ] || fail "no cancel flag"
set +e; "$Q" cancel w1 2>/dev/null; rc=$?; set -e
[ $rc -eq 1 ] || fail "cancel of a done job exit $rc"
$R hset qjob:w3 v 1 id w3 state queued >/dev/null
"$Q" cancel w3 --http "http://127.0.0.1:$HP" --token s3cret >/dev/null || fail "cancel over HTTP"
[ "$($R exists qjob:w3:cancel)" = 1 ] || fail "no cancel flag after HTTP cancel"
echo "test_http_cli: ok"
