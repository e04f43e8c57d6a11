#!/usr/bin/env bash
# Chaos: outputs that cannot or must not be written.
#  - A full file system: a small tmpfs as the output root, too small for the job from the
#    start (refused before work: "not enough disk") and filled up mid-job by another file
#    (the checkpoint write hits ENOSPC: "No space left on device"). The job must fail with
#    that error, not be retried forever, the daemon must take the next job, and nothing
#    outside the job's output (a sibling file, the filler, the model) may change. Needs
#    mount(2) (root); where mounting is not permitted that case is skipped, not the script.
#    A write that hits ENOSPC is retried once (not max-retries times: the retry's pre-flight
#    refuses it), and the failed job's output directory holds its checkpoint alone: no
#    model.safetensors, config.json or other output file of the failed final write.
#  - The same job resubmitted after that failure, with less free space than its whole
#    estimate but enough beside what its checkpoint already holds: the pre-flight counts the
#    checkpoint it resumes from, and the job ends done.
#  - An output that overlaps what the job reads, with "overwrite": true: the output is the
#    model directory, a parent of it, inside it, or contains the calibration file. The job
#    must be refused with an error naming the overlap, and the model directory and the
#    calibration file must be intact (same file list, same sha256).
. "$(dirname "$0")/chaos_common.sh"

make_assets && make_big_model && make_tiny_model || { echo "FAIL: could not make the test models"; exit 1; }

# mount_tmpfs DIR SIZE: a tmpfs at DIR (recorded for unmounting), or skip the case.
mount_tmpfs() {
    mkdir -p "$1"
    mount -t tmpfs -o "size=$2" tmpfs "$1" 2>"$C/mount.err" ||
        skip "cannot mount a tmpfs here ($(cat "$C/mount.err")); the full-disk case needs root and mount(2)"
    echo "$1" >>"$T/mounts"
}
# tree_sum DIR: file list with sha256 of each file (relative paths), for "untouched" checks.
tree_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }

# The daemon stays up and takes a good job afterwards.
takes_next() {
    alive "$DPID" || fail "quantd died"
    push "$(rtn_job next "$C/next")"
    wait_for 60 final next || fail "the next job was not taken: $(hash_dump next)"
    state_is next done || fail "the next job ended $(H next state): $(H next error)"
}
# job_failed_with ID REGEX: ID ended failed, its error matches REGEX (printed either way).
job_failed_with() {
    wait_for 90 final "$1" || fail "$1 did not end: $(hash_dump "$1")"
    local e; e=$(H "$1" error)
    note "$1: state=$(H "$1" state) attempts=$(H "$1" attempts) error=\"$e\""
    grep "task_failed job=$1 \|task_retry job=$1 " "$C/d1.log" | head -3 | sed 's/^/      /'

    state_is "$1" failed || fail "$1 ended $(H "$1" state), not failed"
    grep -Eqi -- "$2" <<<"$e" || fail "$1's error does not say /$2/: $e"
}

disk_too_small() {
    mount_tmpfs "$C/full" 48m
    mkdir -p "$C/full/other" && echo keep >"$C/full/other/sibling.txt"
    local before; before=$(tree_sum "$C/full/other"; tree_sum "$T/assets/big")
    start_redis
    start_daemon d1 n1
    push "$(gptq_job small "$C/full/out")"
    job_failed_with small "not enough disk|no space left"
    [ "$before" = "$(tree_sum "$C/full/other"; tree_sum "$T/assets/big")" ] || fail "files outside the output changed"
    [ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "the failed job is still in the processing list"
    takes_next
}
disk_fills_midjob() {
    mount_tmpfs "$C/full" 256m
    mkdir -p "$C/full/other" && echo keep >"$C/full/other/sibling.txt"
    start_redis
    start_daemon d1 n1
    push "$(gptq_job fill "$C/full/out")"
    wait_for 60 block_done_at fill 2 || fail "fill never got past block 1: $(hash_dump fill)"
    # Take all but ~1 MB of what is left: the next block checkpoint (several MB) cannot fit.
    local avail_kb; avail_kb=$(df -k --output=avail "$C/full" | tail -1 | tr -d ' ')
    dd if=/dev/zero of="$C/full/other/filler" bs=1024 count=$(( avail_kb - 1024 )) status=none 2>/dev/null
    note "filled $C/full: $(df -h --output=avail "$C/full" | tail -1 | tr -d ' ') left, job at next_block=$(next_block "$C/full/out")"
    local before; before=$(tree_sum "$C/full/other"; tree_sum "$T/assets/big")
    job_failed_with fill "no space left|not enough disk"
    [ "$before" = "$(tree_sum "$C/full/other"; tree_sum "$T/assets/big")" ] || fail "files outside the output changed"
    [ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "the failed job is still in the processing list"
    rm -f "$C/full/other/filler"
    takes_next
}
# The output root fills up (another file takes all but 20 MB) while the job quantizes its
# last block: the block's checkpoint still fits, the final write (~144 MB) does not.
disk_full_at_write() {
    mount_tmpfs "$C/full" 256m
    mkdir -p "$C/full/other" && echo keep >"$C/full/other/sibling.txt"
    start_redis
    start_daemon d1 n1
    push "$(gptq_job atwrite "$C/full/out")"
    wait_for 60 block_done_at atwrite 7 || fail "atwrite never reached its last block: $(hash_dump atwrite)"
    local avail_kb; avail_kb=$(df -k --output=avail "$C/full" | tail -1 | tr -d ' ')
    dd if=/dev/zero of="$C/full/other/filler" bs=1024 count=$(( avail_kb - 20480 )) status=none 2>/dev/null
    note "filled $C/full: $(df -h --output=avail "$C/full" | tail -1 | tr -d ' ') left, job at $(stage_of atwrite)"
    local before; before=$(tree_sum "$C/full/other"; tree_sum "$T/assets/big")
    job_failed_with atwrite "no space left|not enough disk"
    # The output's own files (model*.safetensors, config.json, ...; not .quantd/): which one
    # the fill reaches depends on how far the job got while dd ran (a loaded machine: config.json).
    grep -qE "job=atwrite .*/full/out/[^/]+: .*No space left" "$C/d1.log" || fail "the final write did not hit ENOSPC"
    note "output dir after the failure: $(ls -A "$C/full/out" 2>/dev/null | tr '\n' ' ')"
    full_write_failed_cleanly atwrite
    [ "$before" = "$(tree_sum "$C/full/other"; tree_sum "$T/assets/big")" ] || fail "files outside the output changed"
    [ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "the failed job is still in the processing list"
    rm -f "$C/full/other/filler"
    takes_next
}
# full_write_failed_cleanly ID: ID's ENOSPC was retried at most once (docs/daemon.md: "retried once,
# then the pre-flight refuses it"), and its output directory holds the checkpoint alone.
full_write_failed_cleanly() {
    local retries; retries=$(grep -c "task_retry job=$1 " "$C/d1.log")
    [ "$retries" -le 1 ] || fail "$1: a full disk was retried $retries times, not once"
    [ "$(ls -A "$C/full/out" 2>/dev/null | tr '\n' ' ')" = ".quantd " ] ||
        fail "$1 failed but left output files beside its checkpoint: $(ls -A "$C/full/out" | tr '\n' ' ')"
}
# The job of disk_full_at_write, resubmitted after its failure with free space between what
# it needs beside its checkpoint and its whole estimate: it resumes and ends done.
disk_resubmit_after_full() {
    mount_tmpfs "$C/full" 256m
    mkdir -p "$C/full/other"
    start_redis
    start_daemon d1 n1
    push "$(gptq_job again "$C/full/out")"
    wait_for 60 block_done_at again 7 || fail "again never reached its last block: $(hash_dump again)"
    local avail_kb; avail_kb=$(df -k --output=avail "$C/full" | tail -1 | tr -d ' ')
    dd if=/dev/zero of="$C/full/other/filler" bs=1024 count=$(( avail_kb - 20480 )) status=none 2>/dev/null
    job_failed_with again "no space left|not enough disk"
    full_write_failed_cleanly again
    # Free space: the estimate less half of what the checkpoint holds.
    gptq_job again "$C/full/out" >"$C/again.json"
    local est held want
    est=$("$B/quantctl" estimate "$C/again.json" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["disk_bytes"])')
    held=$(python3 -c 'import os,sys; print(sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(sys.argv[1]) for f in fs))' "$C/full/out")
    want=$(( est - held / 2 ))
    rm -f "$C/full/other/filler"
    avail_kb=$(df -k --output=avail "$C/full" | tail -1 | tr -d ' ')
    dd if=/dev/zero of="$C/full/other/filler" bs=1024 count=$(( avail_kb - want / 1024 )) status=none 2>/dev/null
    note "estimate $est B, checkpoint $held B, free now $(( $(df -k --output=avail "$C/full" | tail -1 | tr -d ' ') * 1024 )) B"
    push "$(cat "$C/again.json")"
    wait_for 60 state_is again running || wait_for 60 final again || fail "the resubmitted job was not taken: $(hash_dump again)"
    wait_for 90 final again || fail "the resubmitted job did not end: $(hash_dump again)"
    state_is again done || fail "the resubmitted job ended $(H again state): $(H again error)"
    [ -f "$C/full/out/model.safetensors" ] && [ ! -e "$C/full/out/.quantd" ] || fail "the resumed output is not complete: $(ls -A "$C/full/out" | tr '\n' ' ')"
}
block_done_at() { local nb; nb=$(next_block "$C/full/out"); [ -n "$nb" ] && [ "$nb" -ge "$2" ]; }

# overlap NAME: one overlapping layout, refused, inputs intact.
overlap() {
    local kind=$1 model out calib
    mkdir -p "$C/parent" "$C/data"
    cp -r "$T/assets/tiny" "$C/parent/model"
    cp "$T/assets/calib.json" "$C/data/calib.json"
    echo "other" >"$C/data/notes.txt"
    model="$C/parent/model"
    calib="$C/data/calib.json"
    case $kind in
        model) out=$model ;;
        parent) out="$C/parent" ;;
        inside) out="$model/out" ;;
        calib) out="$C/data" ;;
    esac
    local before; before=$(tree_sum "$C/parent"; tree_sum "$C/data")
    start_redis
    start_daemon d1 n1
    push "{\"id\":\"ov-$kind\",\"model\":\"$model\",\"output\":\"$out\",\"method\":\"gptq\",\"group_size\":32,\"backend\":\"cpu\",\"overwrite\":true,\"calibration\":{\"path\":\"$calib\",\"samples\":4,\"seq_len\":32}}"
    job_failed_with "ov-$kind" "overlap|is the model|contains|lies inside|inside"
    [ "$before" = "$(tree_sum "$C/parent"; tree_sum "$C/data")" ] ||
        fail "the model directory or the calibration data changed: $(diff <(echo "$before") <(tree_sum "$C/parent"; tree_sum "$C/data") | head -10)"
    takes_next
}
case_overlap_model() { overlap model; }
case_overlap_parent() { overlap parent; }
case_overlap_inside() { overlap inside; }
case_overlap_calib() { overlap calib; }

run_case disk-too-small disk_too_small
run_case disk-fills-midjob disk_fills_midjob
run_case disk-full-at-write disk_full_at_write
run_case disk-resubmit-after-full disk_resubmit_after_full
run_case overlap-output-is-model case_overlap_model
run_case overlap-output-is-parent case_overlap_parent
run_case overlap-output-inside-model case_overlap_inside
run_case overlap-output-holds-calib case_overlap_calib
finish
