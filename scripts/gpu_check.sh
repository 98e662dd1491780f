#!/usr/bin/env bash
# On a GPU machine without this project's environment (a lent one: torch 2.11+cu130, Python
# 3.12, no registry): installs the wheels scripts/gpu_wheels.sh fetched into .whl/, then runs
# the `gpu` tests, the GPU channel benchmark and the GPU stages benchmark (our Talker step,
# eager and as CUDA graphs, and Code2wav against transformers' generate). Logs and the
# benchmarks' JSON go to $OUT (or load_tests/results/).
#   bash scripts/gpu_check.sh          # all three; the stages benchmark cut at 300 s
#   bash scripts/gpu_check.sh stages   # the stages benchmark alone, up to 540 s (it writes its
#                                      # JSON after each section, so a cut run keeps those)
#   bash scripts/gpu_check.sh speech   # the speech stages' gpu tests (150 s), then the stages
#                                      # benchmark (390 s): one call that fits a 10-minute limit
#   bash scripts/gpu_check.sh speech --kinds cuda_graph   # arguments after the mode go to
#                                      # bench_gpu_stages.py (--kinds, --sections, --steps)
set -u
only=${1:-all}
shift 2>/dev/null  # the rest go to the stages benchmark (stages and speech modes)
cd "$(dirname "$0")/.."
out=${OUT:-load_tests/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
if [ "$only" = stages ] || [ "$only" = speech ]; then
  tests=0
  if [ "$only" = speech ]; then  # the speech stages' gpu tests first: graphed codes = eager's
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 180 python3 -m pytest -p no:cacheprovider \
      -p asyncio -p pytest_timeout --timeout 120 -v -rs \
      tests/omni_serve/models/qwen3_omni/test_stages_on_gpu.py \
      tests/omni_serve/models/qwen2_5_omni/test_stages_on_gpu.py 2>&1 | tee "$out/pytest_gpu.log"
    tests=${PIPESTATUS[0]}
  fi
  budget=$([ "$only" = speech ] && echo 360 || echo 540)
  timeout "$budget" python3 load_tests/bench_gpu_stages.py "$@" 2>&1 \
    | tee "$out/bench_gpu_stages.log" | tail -30
  cp load_tests/results/bench_gpu_stages.json "$out/" 2>/dev/null
  exit "$tests"
fi
# Plugin autoload off: the project's dev plugins (schemathesis) are not installed there. No
# `-m gpu`: the files are named, and the last test (the channel without Ray) is no gpu test.
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 400 python3 -m pytest -p no:cacheprovider \
  -p asyncio -p pytest_timeout --timeout 120 -v -rs \
  tests/omni_serve/transport/test_direct_gpu.py \
  tests/omni_serve/models/qwen3_omni/test_stages_on_gpu.py \
  tests/omni_serve/models/qwen2_5_omni/test_stages_on_gpu.py \
  tests/omni_serve/models/qwen_image/test_stages_on_gpu.py \
  "tests/omni_serve/transport/test_hosts.py::test_without_ray_installed_payloads_go_and_come_back_on_one_host" \
  2>&1 | tee "$out/pytest_gpu.log"
tests=${PIPESTATUS[0]}
timeout 200 python3 load_tests/bench_channel_gpu.py 2>&1 | tail -12 | tee "$out/bench_channel_gpu.log"
cp load_tests/results/bench_channel_gpu.json "$out/" 2>/dev/null
timeout 300 python3 load_tests/bench_gpu_stages.py 2>&1 | tee "$out/bench_gpu_stages.log" | tail -30
cp load_tests/results/bench_gpu_stages.json "$out/" 2>/dev/null
exit "$tests"
