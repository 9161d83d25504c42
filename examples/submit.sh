#!/bin/sh
# Submit a job to a forkvisor queue without Python: write it in tmp/, then
# publish it with one rename into ready/ (docs/FORMAT.md).
#
#   usage: examples/submit.sh QUEUE FUNCTION [JSON-ARGS-ARRAY] [PRIORITY]
#
# As the queue's owner it writes the job's folder; as anyone else (a member of a
# shared queue) it writes one file into their own folder of incoming/, which a
# manager takes in.
#   e.g.:  examples/submit.sh demo-queue examples.word_count '["README.md"]'
#
# The job says only what to run: the manager that claims it applies the
# function's registered policy (attempts, timeout, backoff), else the queue's.
# job.json is checked before it is published, with jq if it is installed, else
# with python3; with neither, it is published unchecked (a manager buries a
# malformed job in dead/ with the reason).
set -eu
usage="usage: $0 QUEUE FUNCTION [JSON-ARGS-ARRAY] [PRIORITY]"
[ $# -ge 2 ] && [ $# -le 4 ] || { echo "$usage" >&2; exit 2; }
queue=$1 function=$2 args=${3:-[]} priority=${4:-0}

[ -f "$queue/queue.json" ] || { echo "submit.sh: $queue is not a forkvisor queue (no queue.json)" >&2; exit 111; }
[ -n "$function" ] || { echo "submit.sh: FUNCTION is empty: name a registered function" >&2; exit 2; }
case $priority in -*[!0-9]*|*[!0-9-]*|'') echo "submit.sh: priority must be an integer" >&2; exit 2;; esac
[ "$priority" -ge -100 ] && [ "$priority" -le 100 ] || { echo "submit.sh: priority must be in -100..100" >&2; exit 2; }

# Is $1 (a file) a JSON object whose "args" is an array? 0 yes, 1 no, 2 cannot tell.
check_json() {
    if command -v jq >/dev/null 2>&1; then
        jq -e '(type == "object") and (.args | type == "array") and (.function | type == "string")' \
            "$1" >/dev/null 2>&1 || return 1
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import json, sys
job = json.load(open(sys.argv[1]))
sys.exit(0 if isinstance(job, dict) and isinstance(job.get("args"), list) and isinstance(job.get("function"), str) else 1)' \
            "$1" 2>/dev/null || return 1
    else
        return 2
    fi
}

random_hex() { od -An -N4 -tx1 /dev/urandom | tr -d ' \n'; }
id=$(date -u +%Y%m%d-%H%M%S-%6N)-$(random_hex)
# The function name goes in as a JSON string: escape backslashes and quotes.
quoted=$(printf '%s' "$function" | sed 's/\\/\\\\/g; s/"/\\"/g')
job=$(printf '{"function": "%s", "args": %s, "priority": %s}' "$quoted" "$args" "$priority")

# Refuse a job that is not valid JSON before anyone can see it; $1 is where it was written.
refuse_if_bad() {
    status=0
    check_json "$1" || status=$?
    if [ "$status" -eq 1 ]; then
        rm -r "$2"
        echo "submit.sh: the job is not valid JSON: ARGS must be a JSON array, e.g. '[\"a.png\", 320]' (got: $args)" >&2
        exit 2
    elif [ "$status" -eq 2 ]; then
        echo "submit.sh: neither jq nor python3 is installed: job.json was not checked" >&2
    fi
}

if [ "$(stat -c %u "$queue")" = "$(id -u)" ]; then
    # The queue's owner: the job's folder, written in tmp/, published into ready/.
    rank=$(printf '%03d' $((100 - priority)))
    staging="$queue/tmp/$id"
    mkdir -m 700 "$staging"
    printf '%s\n' "$job" >"$staging/job.json"
    refuse_if_bad "$staging/job.json" "$staging"
    sync "$staging/job.json" "$staging"        # durable before it becomes visible
    mv -T "$staging" "$queue/ready/$rank.$id"  # the publishing rename
    sync "$queue/ready"
else
    # Anyone else (a member of a shared queue) may write only their own folder of incoming/,
    # which they make on first use; a manager takes each file in as the owner's job, knowing
    # who submitted it from the folder's owner (docs/FORMAT.md, "Submitting from any language").
    mine="$queue/incoming/$(id -u)"
    [ -d "$mine" ] || (umask 007 && mkdir "$mine") 2>/dev/null || [ -d "$mine" ] ||
        { echo "submit.sh: cannot make $mine (is this a shared queue you are a member of?)" >&2; exit 111; }
    [ "$(stat -c %u "$mine")" = "$(id -u)" ] ||
        { echo "submit.sh: $mine belongs to another user: ask the queue's owner to remove it" >&2; exit 111; }
    staging="$mine/.new.$$.tmp"
    : >"$staging"
    chmod 644 "$staging"
    # A member's id is dated ahead of the moment it is published (by 10 s here), by the file
    # system's clock, which the staging file's change time tells: a manager refuses any id
    # dated before its file, so no id already seen in the queue can be submitted again.
    now=$(stat -c %Z "$staging")
    id=$(date -u -d "@$((now + 10))" +%Y%m%d-%H%M%S)-$(date -u +%6N)-$(random_hex)
    printf '%s\n' "$job" >"$staging"
    refuse_if_bad "$staging" "$staging"
    sync "$staging"
    mv -T "$staging" "$mine/$id.json"
    sync "$mine"
fi
echo "$id"
