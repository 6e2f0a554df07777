#!/usr/bin/env bash
# The GPU suite several times in a row, or beside a cold campaign, on a GPU box: the consecutive green
# runs the two-minute suite must show, with every failure's name kept (a cut log loses them).
#
#   lab/offline/suite_runs.sh [RUNS] [FIRST]            # RUNS runs (default 4), numbered from FIRST (default 1)
#   lab/offline/suite_runs.sh --beside-campaign [MIN]   # one run beside `rope-harness campaign --minutes MIN` (2)
#
# Written under $OUT (the device tool's folder; else /tmp/suite-runs): summary.txt, the host's CPUs and GPU,
# then one line per run (its number, exit status, wall time and pytest's last line), failed.txt (the FAILED lines of every
# run, by run), durations.txt (each run's 25 slowest test phases, by run: the poles of its wall time),
# and the junit XML and reports/summary.md of a run that failed only; beside a campaign also memory.txt
# (the GPU's and the host's memory every 5 s), the campaign's log and its campaign.md (its time and
# each process's GPU memory peak).  At most eight files, as many as the device tool brings back.
# Each run starts from an empty Triton cache, as a fresh machine does; the campaign gets a cache and
# an output folder of its own.
set -u
out=${OUT:-/tmp/suite-runs}
mkdir -p "$out"
# The host first: the suite's time is much of it host work (the interpreter, compiles, CPU references),
# and two GPU boxes of one kind differ by up to twice in it.
echo "host: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
    >> "$out/summary.txt"

one_run() {     # one_run NUMBER: the suite once, its lines appended to the summary
    local i=$1 log="$out/run-$1.log" started rc
    started=$(date +%s)
    TRITON_CACHE_DIR=$(mktemp -d) python3 -m pytest -n auto -p no:cacheprovider -q -rf --durations=25 \
        --junitxml="$out/junit-$i.xml" > "$log" 2>&1
    rc=$?
    echo "run $i: rc=$rc, $(( $(date +%s) - started )) s wall: $(grep -E '(passed|failed)' "$log" | tail -1)" \
        | tee -a "$out/summary.txt"
    grep '^FAILED' "$log" | sed "s/^/run $i: /" >> "$out/failed.txt"
    { echo "## run $i"; sed -n '/slowest 25 durations/,/^$/p' "$log"; } >> "$out/durations.txt"
    if [ "$rc" -eq 0 ]; then
        rm -f "$out/junit-$i.xml"
    else
        cp reports/summary.md "$out/summary-$i.md" 2>/dev/null
    fi
    rm -f "$log"
}

if [ "${1:-}" = "--beside-campaign" ]; then
    minutes=${2:-2}
    campaign_out=$(mktemp -d)
    TRITON_CACHE_DIR=$(mktemp -d) python3 -m rope.harness.cli campaign --minutes "$minutes" \
        --out "$campaign_out" > "$out/campaign.log" 2>&1 &
    campaign=$!
    # Every 5 s the GPU's memory and the host's (a failure beside the campaign may be either running out).
    ( while kill -0 "$campaign" 2>/dev/null; do
          echo "$(date +%T) gpu $(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null)" \
               "host $(free -m | awk '/^Mem:/ {print $3 " MiB used of " $2}')"
          sleep 5
      done ) > "$out/memory.txt" 2>&1 &
    sleep 5                         # the campaign's session under way first
    one_run beside
    wait "$campaign"
    cp "$campaign_out/campaign.md" "$out/" 2>/dev/null
    echo "campaign beside it: $(grep '^campaign:' "$out/campaign.log" | tail -1)" | tee -a "$out/summary.txt"
    exit 0
fi

runs=${1:-4}
first=${2:-1}
for i in $(seq "$first" $(( first + runs - 1 ))); do
    one_run "$i"
done
