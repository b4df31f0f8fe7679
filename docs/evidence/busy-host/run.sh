#!/usr/bin/env bash
# Issue 60's done-when: a 10-trial demo study with two CPU hogs beside its baseline trial (they stop once trial 0's
# line is printed); then the report's header. Run from the repository root.
set -u
export TUNER_STORAGE_DIR=${TUNER_HOG_DIR:-/tmp/hog}/storage
rm -rf "$TUNER_STORAGE_DIR"
sh -c 'while :; do :; done' & H1=$!
sh -c 'while :; do :; done' & H2=$!
echo "hogs $H1 $H2"
.venv/bin/tuner run studies/demo.yaml --trials 10 --no-race 2>&1 | while IFS= read -r line; do
  echo "$line"
  case "$line" in *"trial 0:"*) kill $H1 $H2 2>/dev/null; echo "[hogs stopped]";; esac
done
kill $H1 $H2 2>/dev/null
.venv/bin/tuner report studies/demo.yaml --out ${TUNER_HOG_DIR:-/tmp/hog}/report 2>&1 | head -40
