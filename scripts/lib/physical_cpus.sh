# Sourced by the CPU benchmark scripts (bench_cpu.sh, bench_gguf.sh).
# physical_cpus N: the first CPU of each of the first N physical cores (SMT siblings once),
# comma-separated, for taskset -c.
physical_cpus() {
  local n=$1 list=() seen=" " cpu sib
  for cpu in $(ls -d /sys/devices/system/cpu/cpu[0-9]* | sed 's/.*cpu//' | sort -n); do
    sib=$(cat "/sys/devices/system/cpu/cpu$cpu/topology/thread_siblings_list" 2>/dev/null || echo "$cpu")
    [[ $seen == *" $sib "* ]] && continue
    seen+="$sib "
    list+=("$cpu")
  done
  local IFS=,
  echo "${list[*]:0:$n}"
}
