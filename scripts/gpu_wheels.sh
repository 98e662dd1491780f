#!/usr/bin/env bash
# Fetches, into .whl/, the wheels that scripts/gpu_check.sh installs on a GPU machine that has
# torch but neither this project's environment nor a package registry (Python 3.12, CUDA 13).
# Ray and vLLM do not fit there (a run carries at most 64 MiB), so only what the `gpu` tests
# and load_tests/bench_channel_gpu.py import. Run from the repo root; .whl/ is git-excluded.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
rm -rf .whl && mkdir .whl
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014; do
  platforms+=(--platform "${tag}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl \
  nixl-cu13==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 diffusers==0.42.1 pytest-asyncio==1.5.0 cachetools==8.0.2
# nixl-cu13 ships ~95 MB of expert-parallel torch extensions (nixl_ep_cu13) the channel never
# imports: repack without them so the wheels fit (~39 MB in all).
python3 - .whl/nixl_cu13-*.whl <<'PY'
import os, sys, zipfile

src, dst = sys.argv[1], sys.argv[1] + ".tmp"
with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as new:
    for item in old.infolist():
        if item.filename.startswith("nixl_ep_cu13/"):
            continue
        data = old.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(ln for ln in lines if not ln.startswith("nixl_ep_cu13/")).encode()
        new.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED)
os.replace(dst, src)
PY
du -sh .whl
