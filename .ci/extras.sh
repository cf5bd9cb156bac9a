# shellcheck shell=bash
# Optional agent frameworks for tests/integrations, sourced by .ci/run.
#
# extras_install: classic AG2 (`autogen`, ag2<1), AutoGen 0.4+ and openai into the current
#   environment, and AG2 1.x into .venv-ag2x: both AG2 lines are the `ag2` distribution, so they
#   cannot share one environment. The venv sees the main environment's packages through a .pth
#   file that adds its site dirs (not --system-site-packages: made from a venv, that flag shows the
#   base interpreter's packages), so only AG2 1.x itself is installed there.
# extras_test: runs the AG2 1.x tests in that venv (the main run skips them, naming this step).

EXTRAS_PYTHON="${EXTRAS_PYTHON:-python3}"
AG2X_VENV="${AG2X_VENV:-.venv-ag2x}"

extras_install() {
  local started=$SECONDS
  # .ci/run installs the main environment in one resolve and says so (KX_MAIN_INSTALLED)
  [ -n "${KX_MAIN_INSTALLED:-}" ] || kx_install "$EXTRAS_PYTHON" -e ".[ag2,autogen,openai]" ||
    return 1
  if [ ! -x "$AG2X_VENV/bin/python" ]; then
    "$EXTRAS_PYTHON" -m venv "$AG2X_VENV" || return 1
  fi
  local parents purelib
  parents="$("$EXTRAS_PYTHON" -c 'import site; print("; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages()))')"
  purelib="$("$AG2X_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; $parents" >"$purelib/_kernelexec_main_env.pth"
  # pip, not uv: pip counts what the main environment's site dirs (the .pth above) hold as
  # installed; uv would install AG2's dependencies again, over them.
  "$AG2X_VENV/bin/python" -m pip install --quiet "ag2>=1.0,<2" || return 1
  echo "extras_install: $((SECONDS - started)) s"
}

extras_test() {
  "$AG2X_VENV/bin/python" -m pytest -p no:cacheprovider tests/integrations/test_ag2x.py "$@"
}
