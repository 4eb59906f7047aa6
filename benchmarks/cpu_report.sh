# shellcheck shell=bash
# cpu_report.sh - sourced by benchmarks/precision.sh and train_throughput.sh: the lines that say which
# CPU class a table was measured on and what ran on it (docs/perf/cpu-classes.md keeps one table per
# class: AVX2, AVX-512 with BF16).
#
# cpu_report_machine       date, CPU model, cores, AVX-512 features, load, DDP_CPU_ISA
# cpu_report_ddp LOG...    ddp-train's start-up lines about the CPU (cpu: ISA, compute: GEMM and
#                          OpenBLAS core, oneDNN (...): implementations), each distinct line once
# cpu_report_torch M P     what PyTorch runs for model M in precision P (torch_mnist.py --describe)

cpu_report_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

cpu_report_machine() {
    local avx512
    avx512="$(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); host $(hostname)"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc --all) cores;" \
        "AVX-512: ${avx512:-none}"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg); DDP_CPU_ISA=${DDP_CPU_ISA:-(unset: native)}"
}

# The level DDP_CPU_ISA leaves on this CPU, for a ddp-train that does not print its "cpu:" line.
cpu_report_level() {
    local flags cpu=baseline levels=(baseline avx2 avx512 native) cap=${DDP_CPU_ISA:-native} i
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    [[ $flags == *" avx2 "* && $flags == *" fma "* ]] && cpu=avx2
    [[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512vl "* &&
        $flags == *" avx512dq "* ]] && cpu=avx512
    [[ $cpu == avx512 && ($flags == *" avx512_bf16 "* || $flags == *" amx_bf16 "*) ]] && cpu=native
    for i in 0 1 2 3; do
        [[ ${levels[i]} == "$cap" || ${levels[i]} == "$cpu" ]] && { echo "${levels[i]} (derived: CPU $cpu, cap $cap)"; return; }
    done
}

cpu_report_ddp() {
    local lines
    lines="$(grep -h '^cpu: \|^compute: \|^oneDNN (' "$@" 2>/dev/null | sort -u)"
    grep -q '^cpu: ' <<<"$lines" || echo "cpu: ISA $(cpu_report_level)"
    awk '{ print "ddp " $0 }' <<<"$lines"
}

cpu_report_torch() {
    /usr/bin/python3 "$cpu_report_here/torch_mnist.py" --model "$1" --precision "$2" --describe
}
