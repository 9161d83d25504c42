#!/bin/sh
# Submit a job to a forkvisor queue without Python: write it in tmp/, then
# publish it with one rename into ready/ (docs/FORMAT.md).
#   usage: examples/submit.sh QUEUE FUNCTION [JSON-ARGS-ARRAY] [PRIORITY]
#   e.g.:  examples/submit.sh demo-queue examples.tasks.add '[2, 3]'
set -eu
queue=$1 function=$2 args=${3:-[]} priority=${4:-0}

[ -f "$queue/queue.json" ] || { echo "submit.sh: $queue is not a forkvisor queue (no queue.json)" >&2; exit 111; }
case $priority in -*[!0-9]*|*[!0-9-]*|'') echo "submit.sh: priority must be an integer" >&2; exit 2;; esac
[ "$priority" -ge -100 ] && [ "$priority" -le 100 ] || { echo "submit.sh: priority must be in -100..100" >&2; exit 2; }

id=$(date -u +%Y%m%d-%H%M%S-%6N)-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
rank=$(printf '%03d' $((100 - priority)))
staging="$queue/tmp/$id"

mkdir -m 700 "$staging"
printf '{"function": "%s", "args": %s, "priority": %s}\n' "$function" "$args" "$priority" >"$staging/job.json"
sync "$staging/job.json" "$staging"        # durable before it becomes visible
mv -T "$staging" "$queue/ready/$rank.$id"  # the publishing rename
sync "$queue/ready"
echo "$id"
