"""The /init script of the testbed guest.

The guest prints a progress line to its serial console every report period:

    VMPLACER-PROGRESS <seq> <uptime-seconds> <work-units>

`work-units` only grows, and grows in proportion to the CPU time (spin) or the
memory bandwidth (mem) the guest gets, summed over one worker per vCPU. Tests
read it from the console file to measure a guest's speed independently of
vmplacer (for example: two spin guests on one pCPU each run at about half the
rate of one guest alone).

Workers write their running total into /tmp/w<N>; the reporter loop sums the
largest value seen per worker, so a torn read never makes the total go back.
"""

PROGRESS_TAG = "VMPLACER-PROGRESS"
BOOT_TAG = "VMPLACER-BOOT"
WORKLOADS = ("spin", "mem", "idle")
DEFAULT_REPORT_MS = 250

# Iterations of the empty awk loop between two updates of a spin worker's
# total: small enough for a fresh total at every report, large enough that the
# file write costs nothing measurable.
SPIN_CHUNK = 5000
# MiB zeroed per dd invocation of a mem worker (buffer of 4 MiB: larger than a
# core's L2, so the loop streams memory rather than hitting one cache).
MEM_BLOCK_MIB = 4
MEM_BLOCKS = 16

INIT_SCRIPT = f"""#!/bin/sh
# vmplacer testbed guest: run one workload worker per vCPU, report progress.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp

workload=idle
report_ms={DEFAULT_REPORT_MS}
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        vmplacer.workload=*) workload="${{arg#*=}}" ;;
        vmplacer.report_ms=*) report_ms="${{arg#*=}}" ;;
    esac
done
case "$workload" in spin|mem|idle) ;; *) echo "VMPLACER-ERROR unknown workload '$workload'"; workload=idle ;; esac
ncpu=$(grep -c '^processor' /proc/cpuinfo)
period=$(awk -v ms="$report_ms" 'BEGIN {{ printf "%.3f", ms / 1000 }}')

spin_worker() {{
    awk -v out="/tmp/w$1" -v chunk={SPIN_CHUNK} 'BEGIN {{
        n = 0
        while (1) {{
            for (i = 0; i < chunk; i++) {{ }}
            n += chunk
            printf "%.0f\\n", n > out
            close(out)
        }}
    }}'
}}

mem_worker() {{
    n=0
    while :; do
        dd if=/dev/zero of=/dev/null bs={MEM_BLOCK_MIB}M count={MEM_BLOCKS} 2>/dev/null
        n=$((n + {MEM_BLOCK_MIB * MEM_BLOCKS}))
        echo "$n" > "/tmp/w$1"
    done
}}

w=0
while [ "$w" -lt "$ncpu" ]; do
    echo 0 > "/tmp/w$w"
    case "$workload" in
        spin) spin_worker "$w" & ;;
        mem) mem_worker "$w" & ;;
    esac
    eval "best_$w=0"
    w=$((w + 1))
done

echo "{BOOT_TAG} workload=$workload cpus=$ncpu report_ms=$report_ms"
seq=0
while :; do
    total=0
    w=0
    while [ "$w" -lt "$ncpu" ]; do
        v=""
        read -r v < "/tmp/w$w"
        eval "best=\\$best_$w"
        case "$v" in ''|*[!0-9]*) v=$best ;; esac
        [ "$v" -lt "$best" ] && v=$best
        eval "best_$w=$v"
        total=$((total + v))
        w=$((w + 1))
    done
    read -r up _ < /proc/uptime
    echo "{PROGRESS_TAG} $seq $up $total"
    seq=$((seq + 1))
    sleep "$period"
done
"""
