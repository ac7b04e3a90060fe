#!/bin/bash
# alternate A/B runs of cpu_per_byte (only TCP rows), under one lock acquisition
tag=$1; shift
for i in 1 2; do
  for v in A B; do
    echo "== $v run $i load $(cut -d' ' -f1-3 /proc/loadavg) $(date +%T)"
    (cd /tmp/h6/$v && timeout 400 /work/main/.venv/bin/python benchmarks/cpu_per_byte.py --only-tcp "$@" --tag $v$i --out /tmp/h6/$tag 2>&1 | grep -v bpslaunch | sed -n '/^row/,/^wrote/p')
  done
done
