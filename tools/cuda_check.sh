#!/bin/bash
# The checks that need a GPU, in one run of about 6 minutes on a lent H100 (fewer where the host is fast):
#   1. the CUDA tests: oracle statistics (autocast, GradScaler), no sync between flushes (watch, ActivationStats,
#      three real models), the summary's memory against the caching allocator, fastai's #cuda cells;
#   2. issue 28's rows on CUDA: bare, ActivationStats and watch() defaults, watch(every=1), per model;
#   3. the budget's charged cost against its real cost, on launch-bound and device-bound (batch x32) steps;
#   4. the compiled MLP pair on CUDA.
# Each part has its own time limit, so a slow part leaves the others their time. Run from the repository root
# where a GPU and torch are installed (the project need not be: PYTHONPATH takes src and bench):
#     bash tools/cuda_check.sh [output folder, default ./cuda-check]
out=${1:-cuda-check}
device=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the script itself (the CUDA tests skip)
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else \"no GPU\")"

echo "== CUDA tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -ra tests/watch/test_watch_cuda.py \
  "tests/watch/test_watch_perf_paths.py::test_no_host_device_sync_between_flushes_on_cuda" \
  tests/summary/test_summary_memory.py tests/peers/fastai/test_fastai_hook.py \
  tests/realmodels/test_no_host_reads.py -k "cuda and (gpt2 or tv_resnet or tv_mobilenet_v3) or not no_host_reads" \
  2>&1 | tail -30

configs="ActivationStats defaults (budget 3 %),watch() defaults (budget 3 %),watch(every=1)"
for model in tiny mlp cnn transformer mobile gpt; do
  echo "== overhead $model"
  timeout 80 python3 bench/overhead.py --device "$device" --models "$model" --rounds 5 --steps 100 --memory-steps 0 \
    --no-compile --configs "$configs" --out "$out/overhead_$model.json" 2>&1 | grep "^|\|machine"
done

echo "== budget: real and charged, launch-bound and device-bound steps"
timeout 60 python3 bench/budget.py --models tiny,mlp --device "$device" --rounds 4 --block 400
timeout 60 python3 bench/budget.py --models mobile,mlp --device "$device" --rounds 3 --block 60 --batch 32

echo "== compiled MLP"
timeout 150 python3 bench/overhead.py --device "$device" --models tiny --rounds 5 --steps 100 --memory-steps 0 \
  --configs "watch(every=1)" --compiled mlp --out "$out/overhead_compiled.json" 2>&1 | grep -i "compile\|error"
