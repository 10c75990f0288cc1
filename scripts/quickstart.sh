#!/usr/bin/env bash
# The README's first command: install dependencies, build, and generate text from the
# bundled model (models/hack-tiny, trained on the King James Bible).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
PROMPT=${PROMPT:-"And it came to pass, when the king"}
echo "== hack-run --model models/hack-tiny --prompt \"$PROMPT\""
build/bin/hack-run --model models/hack-tiny --prompt "$PROMPT" --max-tokens 64 --seed 1
