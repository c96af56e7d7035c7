#!/usr/bin/env bash
# Mutation testing (mutmut 3.8) of the pure-Python logic where a wrong branch silently changes
# results. Usage, from anywhere in a checkout with the package installed with its test and
# mutation extras (`pip install ".[test,mutation]"`, or editable):
#
#   scripts/mutation.sh                                  # all four modules, one after the other
#   scripts/mutation.sh generation/sampling.py           # one module per argument
#
# Each module runs in its own copy of the checkout (tracked and untracked, non-ignored files)
# under $MUTATION_WORKDIR (default: a new temporary folder, kept for `mutmut show` / `browse`),
# so the checkout itself gets no mutants/ folder. The copy imports its own src/ (the compiled
# extension is copied in beside it); an editable install's import redirection is switched off.
# MUTATION_CHILDREN sets mutmut's parallel workers (default: all cores). Not in CI: a few
# minutes per module on 2 cores. The last line reads `mutation score: K killed of N (P%)`:
# K counts mutants that made a test fail, time out or crash; N counts every mutant, also those
# no test reached. Equivalent survivors are listed in docs/testing.md.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ALL=(generation/sampling.py generation/speculative.py compression/recipe.py compression/plan.py
     server/schemas.py)

# The tests that exercise each module (slow ones are deselected below).
tests_for() {
  case "$1" in
    generation/sampling.py) echo "tests/generation/test_sampling.py tests/generation/test_generation_config.py tests/generation/test_generator.py" ;;
    generation/speculative.py) echo "tests/generation/test_speculative.py" ;;
    compression/recipe.py) echo "tests/compression/test_recipe.py" ;;
    compression/plan.py) echo "tests/compression/test_recipe.py tests/compression/test_modifiers.py" ;;
    server/schemas.py) echo "tests/server/test_schemas.py" ;;
    *) echo "unknown module '$1'; one of: ${ALL[*]}" >&2; return 2 ;;
  esac
}

modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=("${ALL[@]}")
for m in "${modules[@]}"; do tests_for "$m" >/dev/null; done  # fail early on a bad name

python -c "import mutmut" 2>/dev/null || { echo "mutmut is not installed: pip install 'mutmut==3.8.*'" >&2; exit 2; }
NATIVE="$(python -c 'import importlib.util as u; print(u.find_spec("sparsellm._native").origin)')"
# An editable scikit-build-core install redirects `import sparsellm` to the checkout it was
# installed from, ahead of sys.path; its finder steps aside for the build folder named here.
EDITABLE_SKIP="$(python -c '
import sys
print(":".join(getattr(f, "path", "") or "" for f in sys.meta_path
               if type(f).__name__.startswith("ScikitBuild")))')"
WORKDIR="${MUTATION_WORKDIR:-$(mktemp -d -t sparsellm-mutation.XXXXXX)}"
CHILDREN="${MUTATION_CHILDREN:-$(nproc)}"
echo "work folder: $WORKDIR"

total_killed=0
total_mutants=0
for module in "${modules[@]}"; do
  work="$WORKDIR/${module//\//_}"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- src tests examples pyproject.toml) \
    | python -c '
import shutil, sys
from pathlib import Path
root, work = Path(sys.argv[1]), Path(sys.argv[2])
for name in sys.stdin.read().split("\0"):
    if name and (root / name).is_file():  # tracked files deleted in the checkout are skipped
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, work / name)
' "$ROOT" "$work"
  cp "$NATIVE" "$work/src/sparsellm/"
  # The [tool.mutmut] of pyproject.toml plus this module and its tests.
  (cd "$work" && python - "$module" $(tests_for "$module") <<'EOF'
import json, re, sys, tomllib
from pathlib import Path

module, tests = sys.argv[1], sys.argv[2:]
path = Path("pyproject.toml")
text = path.read_text()
config = tomllib.loads(text).get("tool", {}).get("mutmut", {})
config.update(source_paths=["src/sparsellm"], only_mutate=[f"src/sparsellm/{module}"],
              pytest_add_cli_args_test_selection=tests)
section = "[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items())
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
path.write_text(text.rstrip() + "\n\n" + section)
EOF
  )
  echo "== $module: $(tests_for "$module")"
  mkdir -p "$work/mutants/src"  # on PYTHONPATH from the start: Python caches missing entries
  # One OpenMP thread: mutmut forks its workers from a process that ran torch, whose thread
  # pool does not survive a fork (a forked test would hang until mutmut's timeout).
  (cd "$work" && SKBUILD_EDITABLE_SKIP="$EDITABLE_SKIP" PYTHONPATH="$work/mutants/src" \
     OMP_NUM_THREADS=1 mutmut run --max-children "$CHILDREN" | tr '\r' '\n' | grep -av -e '^[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]' -e '^ *$' \
     && mutmut export-cicd-stats >/dev/null)
  read -r killed total survived no_tests < <(python - "$work/mutants/mutmut-cicd-stats.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(s["killed"] + s["timeout"] + s["segfault"], s["total"], s["survived"], s["no_tests"])
EOF
  )
  (cd "$work" && SKBUILD_EDITABLE_SKIP="$EDITABLE_SKIP" mutmut results | sed 's/^ */   /')
  echo "$module: $killed killed of $total ($survived survived, $no_tests not reached by the tests)"
  total_killed=$((total_killed + killed))
  total_mutants=$((total_mutants + total))
done
python -c "import sys; k, n = map(int, sys.argv[1:]); print(f'mutation score: {k} killed of {n} ({100 * k / max(n, 1):.1f}%)')" \
  "$total_killed" "$total_mutants"
