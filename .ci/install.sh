# shellcheck shell=bash
# Sourced first by .ci/run: one way to install Python packages, for every environment CI makes.
#
#   kx_install PYTHON ARGS...  install ARGS (pip's syntax) into PYTHON's environment, with uv
#                              where it could be installed (it resolves and downloads in
#                              parallel and compiles no bytecode: the main environment took
#                              181 s with pip, about 60 s with uv on this machine), else pip.
#   kx_get_uv                  puts uv in the current virtualenv (from the package index, as
#                              any package); when that fails, kx_install falls back to pip.

kx_get_uv() {
    python3 -m pip install -q uv >/dev/null 2>&1 || echo "install.sh: no uv; installing with pip"
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
