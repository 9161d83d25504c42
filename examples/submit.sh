#!/bin/sh
# Submit a job to a forkvisor queue without Python: write it in tmp/, then
# publish it with one rename into ready/ (docs/FORMAT.md).
#
#   usage: examples/submit.sh QUEUE FUNCTION [JSON-ARGS-ARRAY] [PRIORITY]
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

id=$(date -u +%Y%m%d-%H%M%S-%6N)-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
rank=$(printf '%03d' $((100 - priority)))
staging="$queue/tmp/$id"

mkdir -m 700 "$staging"
# The function name goes in as a JSON string: escape backslashes and quotes.
quoted=$(printf '%s' "$function" | sed 's/\\/\\\\/g; s/"/\\"/g')
printf '{"function": "%s", "args": %s, "priority": %s}\n' "$quoted" "$args" "$priority" >"$staging/job.json"
status=0
check_json "$staging/job.json" || status=$?
if [ "$status" -eq 1 ]; then
    rm -r "$staging"
    echo "submit.sh: the job is not valid JSON: ARGS must be a JSON array, e.g. '[\"a.png\", 320]' (got: $args)" >&2
    exit 2
elif [ "$status" -eq 2 ]; then
    echo "submit.sh: neither jq nor python3 is installed: job.json was not checked" >&2
fi
sync "$staging/job.json" "$staging"        # durable before it becomes visible
mv -T "$staging" "$queue/ready/$rank.$id"  # the publishing rename
sync "$queue/ready"
echo "$id"
