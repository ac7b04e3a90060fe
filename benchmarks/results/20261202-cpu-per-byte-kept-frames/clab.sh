#!/bin/bash
# alternate A/B cluster runs (1 Gbit/s, 4 + 4, 100 MB, byteps and gloo), one lock acquisition
for i in 1 2; do
  if [ $i = 2 ] && [ $(date +%H%M) -gt 1432 ]; then echo "no time for run 2"; break; fi
  for v in A B; do
    echo "== $v run $i load $(cut -d' ' -f1-3 /proc/loadavg) $(date +%T)"
    (cd /tmp/h6/$v && timeout 420 /work/main/.venv/bin/python -m benchmarks.cluster.run --rates 1gbit --workers 4 --systems byteps,gloo --out /tmp/h6/cl$v$i 2>&1 | grep -E "mesh|s/op|byteps|gloo|Error|error" | head -30)
  done
done
