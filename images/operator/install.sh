#!/bin/sh
# The operator image's install steps. images/operator/Dockerfile runs them to build the image;
# tests/helm/test_operator_image.py runs the same two commands in a clean directory.
#   install.sh wheel SRC DIST    build kvq's wheel (no dependencies) from the source tree SRC
#   install.sh venv DIST PREFIX  a fresh virtualenv at PREFIX with that wheel and its dependencies
set -eu
python=${PYTHON:-python3}
case "${1:-}" in
  wheel)
    "$python" -m pip wheel --disable-pip-version-check --no-deps --wheel-dir "$3" "$2"
    ;;
  venv)
    "$python" -m venv "$3"
    set -- "$2"/kvq-*.whl "$3"
    [ -f "$1" ] || { echo "install.sh: no kvq wheel in ${1%/*}" >&2; exit 1; }
    # [fetch]: huggingface_hub, boto3, filelock for `kvq fetch`, the engine pods' model download
    "$2/bin/pip" install --disable-pip-version-check --no-compile "$1[fetch]"
    # The image runs as a non-root user on a read-only root filesystem: nothing to write here.
    "$2/bin/kvq" --help >/dev/null
    ;;
  *)
    echo "usage: install.sh wheel SRC DIST | install.sh venv DIST PREFIX" >&2
    exit 2
    ;;
esac
