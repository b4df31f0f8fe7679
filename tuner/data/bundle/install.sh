#!/bin/sh
# Installs this offline bundle of llama-tuner without network: checks the build tools, makes .venv from
# wheels/ with pip --no-index, and puts the pinned llama.cpp source archive where `make llama` looks for it.
# `tuner bundle` writes the values below; PYTHON=python3.X picks another interpreter.
set -eu
cd "$(dirname "$0")"
BUNDLE_PYTHON="@PYTHON_VERSION@"
BUNDLE_PLATFORM="@PLATFORM@"
EXTRAS="@EXTRAS@"
SDIST="@SDIST@"
PY="${PYTHON:-python3}"

fail() {
    echo "install.sh: $*" >&2
    exit 1
}

# What is missing, and the packages that bring it under apt (Debian, Ubuntu) and dnf (Fedora, RHEL).
missing=""
apt=""
dnf=""
need() {
    command -v "$1" >/dev/null 2>&1 && return 0
    missing="$missing $1"
    apt="$apt $2"
    dnf="$dnf $3"
}
need cmake cmake cmake
need make build-essential make
need cc build-essential gcc
need c++ build-essential gcc-c++
need "$PY" python3 python3
if command -v "$PY" >/dev/null 2>&1 && ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing="$missing $PY-venv"
    apt="$apt python3-venv"
    dnf="$dnf python3"
fi
if [ -n "$missing" ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo "
    apt=$(printf '%s\n' $apt | sort -u | tr '\n' ' ')
    dnf=$(printf '%s\n' $dnf | sort -u | tr '\n' ' ')
    if command -v apt-get >/dev/null 2>&1; then
        how="${sudo}apt-get install -y $apt"
    elif command -v dnf >/dev/null 2>&1; then
        how="${sudo}dnf install -y $dnf"
    else
        how="${sudo}apt-get install -y $apt(Debian, Ubuntu) or ${sudo}dnf install -y $dnf(Fedora, RHEL)"
    fi
    fail "missing:$missing; install with: ${how% }, then run ./install.sh again"
fi

have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$have" = "$BUNDLE_PYTHON" ] || fail "the wheels are for Python $BUNDLE_PYTHON but $PY is $have; run" \
    "\`make bundle PYTHON_VERSION=$have\` on the connected machine, or PYTHON=python$BUNDLE_PYTHON ./install.sh"
if command -v sha256sum >/dev/null 2>&1 && ! sha256sum -c SHA256SUMS >/dev/null 2>&1; then
    fail "some files differ from SHA256SUMS (\`sha256sum -c SHA256SUMS\` names them); copy the bundle again"
fi

echo "install.sh: .venv from wheels/ with $PY $have, no network (a minute or two)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/python -m pip install --quiet --no-index --find-links wheels \
    -e ".$EXTRAS" >.venv/install.log 2>&1; then
    why=$(grep '^ERROR' .venv/install.log | tail -n 1)
    fail "pip could not install from wheels/ (${why:-see .venv/install.log}); the wheels are for Python" \
        "$BUNDLE_PYTHON on $BUNDLE_PLATFORM: run \`make bundle\` with this host's PYTHON_VERSION and PLATFORM"
fi
touch .venv/.installed  # make's stamp: `make setup` has nothing left to install
[ ! pyproject.toml -nt .venv/.installed ] || touch -r pyproject.toml .venv/.installed  # a clock behind the archive's
.venv/bin/tuner llama --sdist "$SDIST" --fetch-only

echo "install.sh: installed. Next, on this host:"
echo "  make llama    # builds the pinned llama.cpp from the bundled source, no network (5-12 min on 2 cores)"
echo "  make demo     # the demo end to end; for a study of yours: .venv/bin/tuner run studies/NAME.yaml --check"
