# shellcheck shell=bash
# Sourced first by .ci/run: one way to install Python packages, for every environment CI makes.
#
#   kx_install PYTHON ARGS...  install ARGS (pip's syntax) into PYTHON's environment, with uv
#                              where it could be installed (it resolves and downloads in
#                              parallel and compiles no bytecode: the main environment took
#                              181 s with pip, about 60 s with uv on this machine), else pip.
#   kx_venv DIR                a fresh virtualenv at DIR (pip in it only when there is no uv)
#   kx_get_uv                  puts uv on PATH (from the package index, installed by the base
#                              interpreter's pip, $KX_BASE_PYTHON, into a folder of its own);
#                              when that fails, the current virtualenv gets pip (ensurepip)
#                              and kx_install uses it.

KX_UV_DIR="${TMPDIR:-/tmp}/kernelexec-ci-uv"

kx_get_uv() {
    rm -rf "$KX_UV_DIR"
    if "${KX_BASE_PYTHON:-python3}" -m pip install -q --target "$KX_UV_DIR" uv >/dev/null 2>&1 &&
        "$KX_UV_DIR/bin/uv" --version >/dev/null 2>&1; then
        export PATH="$KX_UV_DIR/bin:$PATH"
        return 0
    fi
    echo "install.sh: no uv; installing with pip"
    python3 -m pip --version >/dev/null 2>&1 || python3 -m ensurepip -q
}

# kx_venv DIR: a fresh virtualenv; pip only when kx_install will need it (no uv).
kx_venv() {
    if command -v uv >/dev/null 2>&1; then
        python3 -m venv --without-pip "$1"
    else
        python3 -m venv "$1"
    fi
}

kx_install() {
    local python=$1
    shift
    if command -v uv >/dev/null 2>&1; then
        uv pip install --quiet --python "$python" "$@"
    else
        "$python" -m pip install --quiet "$@"
    fi
}

# kx_bytecode PYTHON [DIR...]: compile PYTHON's site-packages (and DIRs) to bytecode beside the
# sources, as pip does at install and uv does not. Without it every Python process the tests
# start (thousands: kernels, sandboxes, CLI runs) compiles what it imports from source again
# (importing ipykernel: 2.5 s of CPU against 0.5 s from bytecode); PYTHONDONTWRITEBYTECODE keeps
# them from caching it themselves.
kx_bytecode() {
    local python=$1 started=$SECONDS
    shift
    # Not the packages' own tests, nor the tools that only build and check (pip, setuptools,
    # mypy, the docs site's): no test imports them, and they are a quarter of the files.
    local skip='site-packages/(.*/tests?/|(pip|setuptools|mypy|mkdocs[^/]*|pymdownx|babel)/)'
    "$python" -m compileall -q -j 0 -x "$skip" \
        "$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" "$@" \
        >/dev/null ||
        echo "kx_bytecode: some files did not compile (an optimisation only: they are imported from source)"
    echo "kx_bytecode: $((SECONDS - started)) s"
}
