# shellcheck shell=bash
# Sourced by .ci/run: the other languages' kernels and interpreters (issue 36).
#
#   languages_install  IRkernel and R from apt (R's graphics come with r-base-core; the
#                      recommended extras are not needed), in the background: it is the slow
#                      part (it waits for the dpkg lock other steps hold meanwhile). Deno and
#                      bash_kernel come with the dev extra (kernelexec[languages]);
#                      their kernelspecs are installed here, into this environment.
#   languages_image    the Docker image variant with R, Deno and bash kernels
#                      (kernelexec/python:langs) on top of the image docker_image built: R from
#                      the same Debian mirror, Deno's binary and bash_kernel from the wheels of
#                      this environment's versions. About 80 s; run in the background by
#                      .ci/run, awaited before the tests (tests/docker/test_languages_docker.py).
#   languages_wait     waits for the apt step, checks the three kernelspecs, then sets
#                      KERNELEXEC_REQUIRE_LANGUAGES=1: their tests fail instead of skipping.

LANGUAGES_LOG="${TMPDIR:-/tmp}/kernelexec-languages-apt.log"
LANGUAGES_PID=""

# A machine whose package lists are stale or missing gets them updated, then tries again.
_kx_apt_irkernel() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o DPkg::Lock::Timeout=900 r-cran-irkernel
}

languages_install() {
    if [ "$(id -u)" != "0" ] && ! command -v R >/dev/null 2>&1; then
        echo "languages.sh: R is missing and we are not root: cannot install it" >&2
        return 1
    fi
    (
        [ -f /usr/share/jupyter/kernels/ir/kernel.json ] || _kx_apt_irkernel ||
            { DEBIAN_FRONTEND=noninteractive apt-get update -qq && _kx_apt_irkernel; }
    ) >"$LANGUAGES_LOG" 2>&1 &
    LANGUAGES_PID=$!
    python3 -m bash_kernel.install --sys-prefix >/dev/null
    _kx_deno_kernelspec
}

# Deno's own `deno jupyter --install` writes into the user's Jupyter data dir, which outlives
# this environment (a spec naming a deleted checkout's deno was found there): the spec goes into
# this environment instead, as bash_kernel's does, naming this environment's deno.
_kx_deno_kernelspec() {
    python3 - "$(command -v deno)" <<'PY'
import json, sys
from pathlib import Path
spec = Path(sys.prefix, "share", "jupyter", "kernels", "deno")
spec.mkdir(parents=True, exist_ok=True)
argv = [sys.argv[1], "jupyter", "--kernel", "--conn", "{connection_file}"]
kernel = {"argv": argv, "display_name": "Deno", "language": "typescript"}
(spec / "kernel.json").write_text(json.dumps(kernel, indent=2))
PY
}

languages_image() {
    python3 -m kernelexec image build --offline --languages r,js,bash
}

languages_wait() {
    if [ -n "$LANGUAGES_PID" ] && ! wait "$LANGUAGES_PID"; then
        cat "$LANGUAGES_LOG" >&2
        return 1
    fi
    local specs
    specs="$(jupyter kernelspec list)"
    for kernel in ir deno bash; do
        if ! grep -q "^ *$kernel " <<<"$specs"; then
            echo "languages.sh: no kernelspec '$kernel' after the install" >&2
            return 1
        fi
    done
    command -v Rscript >/dev/null && command -v deno >/dev/null
    export KERNELEXEC_REQUIRE_LANGUAGES=1
}
