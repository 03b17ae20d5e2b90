#!/usr/bin/env bash
# The docs' screenshots of a run's report.html and of a dashboard, taken in headless Chromium
# (Debian's chromium, which `make setup` installs as root). Without it: one line, nothing changed.
#   bash scripts/docs_screenshots.sh        (from the repository root, after make setup)
set -euo pipefail
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
    echo "docs_screenshots: $CHROMIUM not found: screenshots skipped (docs/assets keeps the committed ones)"
    exit 0
fi
BIN=${BIN:-.venv/bin}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$BIN/gradleak" attack --threads 1 --no-progress --out "$WORK/runs/demo" >/dev/null
"$BIN/gradleak" attack --threads 1 --no-progress --attack idlg --iterations 50 --defense gaussian:1 \
    --out "$WORK/runs/gaussian" >/dev/null
"$BIN/gradleak" dashboard "$WORK/runs" >/dev/null
shot() {  # shot PAGE OUT.png HEIGHT
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,"$3" \
        --screenshot="$WORK/shot.png" "file://$1" >/dev/null 2>&1
    "$BIN/python" -c "import sys; from PIL import Image; Image.open(sys.argv[1]).convert('P', palette=Image.ADAPTIVE).save(sys.argv[2], optimize=True)" \
        "$WORK/shot.png" "$2"
    echo "wrote $2"
}
shot "$WORK/runs/demo/report.html" docs/assets/report.png 1500
shot "$WORK/runs/dashboard.html" docs/assets/dashboard.png 1100
