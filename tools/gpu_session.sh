#!/usr/bin/env bash
# One call on a lent CUDA machine (the device tool, #39): the CUDA tests, the GPU benches
# and then the whole suite in the time left, each step's log and the results under $OUT.
#
#   tools/gpu_session.sh [STEPS] [DEADLINE_S]
#
# STEPS: a comma list of env,cuda,table2,decoder,suite (default: all of them, in that
# order); DEADLINE_S (default 470): seconds after which no step starts, and the suite's
# time limit is what is left. Python packages the machine lacks travel as wheels in
# .whl/, made here by tools/gpu_wheels.sh; the library is installed from this checkout.
# Called as: device run, command "tools/gpu_session.sh", carry [".whl"], timeout_s 520.
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
STEPS=${1:-env,cuda,table2,decoder,suite}
DEADLINE=${2:-470}
START=$(date +%s)
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
{
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
} >"$OUT/install.log" 2>&1
echo "install: $(tail -n 3 "$OUT/install.log")"

left() { echo $((DEADLINE - ($(date +%s) - START))); }
step() {  # step NAME SECONDS COMMAND...: run COMMAND for at most SECONDS (or what is left)
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) return ;; esac
  local rest; rest=$(left)
  [ "$rest" -lt "$limit" ] && limit=$rest
  if [ "$limit" -le 10 ]; then echo "== $name: skipped, no time left"; return; fi
  echo "== $name: start $(date +%T), limit ${limit}s"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: rc=$? after $(( $(date +%s) - START ))s"
  tail -n "${TAIL:-30}" "$OUT/$name.log"
}

step env 60 bash -c 'nvidia-smi; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), transformers.__version__)"; df -h . /tmp; nproc; free -g'
step cuda 150 python3 -m pytest -p no:cacheprovider -rs -q tests/engine/test_cuda.py tests/engine/test_engine.py tests/engine/test_auto_pipeline.py
step decoder 120 python3 bench/gpu_pipeline.py decoder --rounds 3
step table2 240 python3 bench/gpu_pipeline.py table2 --rounds 8
step suite 600 python3 -m pytest -p no:cacheprovider -q -n 14 --dist loadfile tests
tar czf "$OUT/results.tgz" bench/results/gpu_* 2>/dev/null
echo "== done after $(( $(date +%s) - START ))s"
