#!/usr/bin/env bash
# test-python.sh - builds the Python package (python/) into a venv made from
# Debian's python3 and runs its pytest suite against real ps-server
# processes (make test-python; make test runs it). Offline: the venv sees
# Debian's numpy and pytest (--system-site-packages) and pip builds with
# Debian's setuptools (--no-build-isolation --no-index).
#
#   scripts/test-python.sh [PYTEST ARGS...]     e.g. -k fork -x
#   scripts/test-python.sh --install-only       the venv and the package only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
venv=build/pyvenv
[ -x lib/libps.so.1 ] || [ -e lib/libps.so ] || { echo "test-python: lib/libps.so missing: run make" >&2; exit 1; }
if [ ! -x $venv/bin/python ]; then
  $PY -m venv --system-site-packages $venv
fi
$venv/bin/python -m pip install -q --no-build-isolation --no-index --no-deps \
  --force-reinstall ./python >build/pyvenv-install.log 2>&1 ||
  { cat build/pyvenv-install.log >&2; echo "test-python: pip install ./python failed" >&2; exit 1; }
[ "${1:-}" = --install-only ] && exit 0
if [ -z "${PS_SECRET_FILE:-}" ]; then
  secret=$(mktemp /tmp/ps-pytest-secret.XXXXXX)
  trap 'rm -f "$secret"' EXIT
  rm -f "$secret"
  scripts/ps-keygen "$secret" 2>/dev/null
  export PS_SECRET_FILE=$secret
fi
# from python/tests, so that `import ps` is the installed package
cd python/tests
exec ../../$venv/bin/python -m pytest -q -p no:cacheprovider "$@" .
