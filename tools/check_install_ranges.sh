#!/usr/bin/env bash
# Installs sparseps into a Python 3.11 venv that already holds other versions of its
# dependencies (the low ends of pyproject.toml's ranges, not constraints.txt's pins) and
# checks that pip changes none of them, then that the package works with them: a few
# sample-based and multi-process tests and a demo-sized job. docs/install.md records a run.
#
#   tools/check_install_ranges.sh [PYTHON]      (default python3; about 2-3 minutes)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# the "other" versions: each within the declared range, none equal to constraints.txt's
others=(numpy==2.3.5 pyarrow==25.0.1 numba==0.68.0 pyzmq==27.2.0 msgpack==1.2.3 xxhash==4.0.1
        torch==2.13.0 pytest pytest-timeout hypothesis)

"$python" -m venv "$work/venv"
pip="$work/venv/bin/pip"
echo "== $("$work/venv/bin/python" --version), existing environment: ${others[*]}"
"$pip" install -q "${others[@]}"
"$pip" freeze --all | sort > "$work/before.txt"

echo "== pip install -e $repo  (no constraints, no --no-deps)"
"$pip" install -e "$repo" > "$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
grep -E "^(Successfully installed|Installing collected)" "$work/install.log" || true
"$pip" freeze --all | grep -v "^-e \|^# Editable" | sort > "$work/after.txt"
changed="$(comm -23 "$work/before.txt" "$work/after.txt")"   # there before, gone after
if [ -n "$changed" ]; then
    diff -u "$work/before.txt" "$work/after.txt" || true
    echo "FAIL: installing sparseps changed packages that were already within its ranges:"
    echo "$changed"
    exit 1
fi
echo "== added (were missing): $(comm -13 "$work/before.txt" "$work/after.txt" | tr '\n' ' ')"
echo "== unchanged: $(grep -cE '^(numpy|pyarrow|numba|llvmlite|pyzmq|msgpack|xxhash|torch)==' "$work/after.txt") dependencies kept as they were:"
grep -E "^(numpy|pyarrow|numba|llvmlite|pyzmq|msgpack|xxhash|torch)==" "$work/after.txt" | tr '\n' ' '
echo

echo "== tests with these versions"
cd "$repo"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider tests/data/test_data_formats.py \
    tests/table/test_table_hashmap.py tests/rpc/test_rpc_cluster.py \
    tests/checkpoint/test_staging_and_layout.py 2>&1 | tail -n 2
echo "== demo (20000 rows)"
"$work/venv/bin/sparseps" demo --rows 20000 --out "$work/demo" --json 2>"$work/demo.log" | tail -n 1 | "$work/venv/bin/python" -c \
    'import json, sys; s = json.loads(sys.stdin.read()); print({k: s[k] for k in ("rows", "test_auc", "bayes_auc", "samples_per_s")})'
echo "OK"
