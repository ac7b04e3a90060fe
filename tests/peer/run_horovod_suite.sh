#!/usr/bin/env bash
# Run Horovod's own test suites against byteps with only their import lines changed, and
# print one table per suite and layout (passed, failed, skipped per rank; the cause of
# each failure).  Fetches nothing: it takes the path of a Horovod checkout (a work tree).
#
#   tests/peer/run_horovod_suite.sh HOROVOD_DIR [SUITE...]
#   tests/peer/run_horovod_suite.sh --prepare-only HOROVOD_DIR OUT_DIR   # copies only
#
# SUITE: torch, tensorflow, keras, tf2keras, mxnet (default: these five), process_sets,
# process_sets_static, process_sets_dynamic, keras_process_sets, timeline, common.  Each
# runs in a byteps job of 2 workers on 2 hosts and of 2 local ranks (--local-size 2) through
# tests/horovod/run.py (HVD_LAYOUTS="2hosts local2 3workers" to change; HVD_SELECT: a
# pytest -k expression; HVD_REVERSE=1: the tests in reverse order; HVD_JUNIT_DIR: where
# the per-rank junit files and job logs go, default /tmp/byteps-horovod-suites).
# MXNet's suites run in .venv-mxnet (mxnet 1.9.1 needs numpy < 1.24), the others in .venv;
# tf2keras with TF_USE_LEGACY_KERAS=1 (tf-keras: the suite uses the Keras 2 API).
#
# A work tree from a bare mirror (as on the development machines):
#   git -C /work/.mirror/horovod+horovod/repo worktree add /tmp/horovod HEAD
# or, leaving the mirror untouched:
#   mkdir /tmp/horovod && git -C /work/.mirror/horovod+horovod/repo archive HEAD test | tar -x -C /tmp/horovod
# Only test/parallel/ is read.  The suites import three helpers from Horovod's
# test/utils/common.py, whose other code needs mock and horovod.runner; they are taken,
# unchanged, from tests/horovod/utils/common.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
PY_MXNET="${PY_MXNET:-$ROOT/.venv-mxnet/bin/python}"

# suite name -> the files of test/parallel it needs (the first is the one pytest runs)
files_of() {
  case "$1" in
    torch) echo "test_torch.py" ;;
    tensorflow) echo "test_tensorflow.py base_test_tensorflow.py" ;;
    keras) echo "test_keras.py" ;;
    tf2keras) echo "test_tensorflow2_keras.py" ;;
    mxnet) echo "test_mxnet1.py test_mxnet2.py base_test_mxnet.py" ;;
    process_sets) echo "test_tensorflow_process_sets.py base_test_tensorflow.py" ;;
    process_sets_static) echo "test_process_sets_static.py" ;;
    process_sets_dynamic) echo "test_tensorflow_process_sets_dynamic.py base_test_tensorflow.py" ;;
    keras_process_sets) echo "test_tensorflow2_keras_process_sets.py" ;;
    timeline) echo "test_timeline.py" ;;
    common) echo "test_common.py" ;;
    *) echo "unknown suite '$1' (torch, tensorflow, keras, tf2keras, mxnet, process_sets," \
            "process_sets_static, process_sets_dynamic, keras_process_sets, timeline, common)" >&2
       return 2 ;;
  esac
}

# copy every test/parallel/*.py to $2/parallel with `import horovod.X` / `from horovod.X`
# lines changed to byteps.X (nothing else), and the helpers to $2/utils
prepare() {
  local src="$1/test/parallel" out="$2" f
  [ -d "$src" ] || { echo "$1: no test/parallel (a Horovod checkout?)" >&2; return 2; }
  mkdir -p "$out/parallel" "$out/utils"
  cp "$ROOT/tests/horovod/utils/common.py" "$out/utils/common.py"
  for f in $(cd "$src" && ls ./*.py | sed 's|^\./||'); do
    sed -E '/^[[:space:]]*(import|from)[[:space:]]+horovod\./s/(^|[^.[:alnum:]_])horovod\./\1byteps./' \
      "$src/$f" > "$out/parallel/$f"
    # report every changed line, so a reader sees that nothing else changed
    diff "$src/$f" "$out/parallel/$f" | grep '^>' | sed "s|^> |  $f: |" || true
  done
}

if [ "${1:-}" = "--prepare-only" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 --prepare-only HOROVOD_DIR OUT_DIR" >&2; exit 2; }
  prepare "$2" "$3"
  exit 0
fi
[ $# -ge 1 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
HVD="$1"; shift
SUITES=("$@"); [ ${#SUITES[@]} -gt 0 ] || SUITES=(torch tensorflow keras tf2keras mxnet)
TMP="$(mktemp -d /tmp/hvd-suites.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
echo "Horovod checkout: $HVD ($(git -C "$HVD" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
echo "lines changed:"
prepare "$HVD" "$TMP"

read -r -a LAYOUTS <<< "${HVD_LAYOUTS:-2hosts local2}"
largs=(); for l in "${LAYOUTS[@]}"; do largs+=(--layout "$l"); done
extra=(); [ -n "${HVD_SELECT:-}" ] && extra+=(-k "$HVD_SELECT")
[ "${HVD_REVERSE:-0}" = "1" ] && extra+=(--reverse)
status=0
for s in "${SUITES[@]}"; do
  read -r -a fs <<< "$(files_of "$s")"
  main="${fs[0]}"
  [ -f "$TMP/parallel/$main" ] || { echo "$s: $main not in this checkout"; status=1; continue; }
  py="$PY"; [ "$s" = mxnet ] && py="$PY_MXNET"
  suites=(--suite "$main"); [ "$s" = mxnet ] && suites+=(--suite test_mxnet2.py)
  # test_tensorflow2_keras.py is written for the Keras 2 API: tf-keras (docs/tensorflow.md)
  legacy="${TF_USE_LEGACY_KERAS:-0}"; [ "$s" = tf2keras ] && legacy=1
  TF_USE_LEGACY_KERAS="$legacy" "$py" "$ROOT/tests/horovod/run.py" --suite-dir "$TMP/parallel" "${suites[@]}" \
    "${largs[@]}" "${extra[@]}" --junit-dir "${HVD_JUNIT_DIR:-/tmp/byteps-horovod-suites}" \
    || status=1
done
exit $status
