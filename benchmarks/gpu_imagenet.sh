#!/usr/bin/env bash
# Issue 39 on a lent GPU machine (device tool): ONE prepared command, about 9.5 minutes.
#
# 1. benchmarks/gpu.py: the paper preset's step time at 224 px (EfficientNet-Lite0, batch 8, G = 8)
#    and the precision comparison on the same model -> $OUT/gpu.json, the paper run projected.
# 2. If the paper's whole budget (20 000 steps x 8 seeds + 150 registrations) fits the time left,
#    that run (`gradleak attack --preset paper`), its small files -> $OUT/paper-budget.tar.gz.
#    Otherwise benchmarks/imagenet_levers.py's schedules at 25x their CPU steps (the paper variant:
#    1750 Eq. 3 steps, about what 2 hours of this project's 2-core CPU buys) on the GPU, in the
#    order below, each skipped when it would overrun -> $OUT/levers.json and levers.png.
# The paper's budget projects to 3.1 h on an H200 and cannot be run in chunks across leases: its
# resumable state (G = 8, batch 8, 224 px, with Adam's moments) is 110 MiB, more than the 64 MiB a
# device call carries back and forth (measured 2026-11-29).
#
# Here:   bash benchmarks/gpu_wheels.sh
# Then:   run(carry=[".whl"], timeout_s=600, command="bash benchmarks/gpu_imagenet.sh")
set -uo pipefail
T0=$(date +%s)
BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
timeout 120 python3 benchmarks/gpu.py --models efficientnet-lite0 --iterations 30 --skip seeds_224,seeds_32 \
  --precision-model efficientnet-lite0 --out "$OUT" || echo "gpu.py failed or ran out of its 120 s"
PROJECTED=$(python3 -c "import json; d=json.load(open('$OUT/gpu.json')); print(int(d['paper'][0]['projected_paper_run_s']))" \
  2>/dev/null || echo 999999)
echo "paper run projected: $PROJECTED s; $(left) s left"
if [ "$PROJECTED" -lt $(( $(left) - 90 )) ]; then
  RUN=/tmp/paper-budget/run
  timeout $(( $(left) - 20 )) python3 -c 'import sys; from gradleak.cli import main; sys.argv[0] = "gradleak"; sys.exit(main())' \
    attack --attack gradinversion --model efficientnet-lite0 --data imagenet-samples --batch-size 8 --preset paper \
    --share-bn-statistics --device cuda --log-every 100 --checkpoint-every 0 --no-progress --out "$RUN"
  echo "paper run exit $?"
  tar -czf "$OUT/paper-budget.tar.gz" --exclude='state*' --exclude='*.safetensors' -C /tmp/paper-budget run
else
  python3 benchmarks/imagenet_levers.py --device cuda --only baselines,schedules --scale 25 --log-every 50 \
    --seconds $(( $(left) - 15 )) --out "$OUT/levers.json" --grid "$OUT/levers.png" \
    --variants feature_lowres_then_grad_224,lowres,paper,feature_lowres,zero_start,feature_lowres_then_grad,feature_lowres_di,feature_warm,grad_weighted_lowres,bn_warm
fi
ls -la "$OUT"
