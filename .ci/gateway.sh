# shellcheck shell=bash
# Sourced by .ci/run. The gateway tests start a real Jupyter Kernel Gateway and a real Jupyter
# Enterprise Gateway; each lives in a virtualenv of its own at the repository root, so their
# jupyter_server / jupyter_client pins never touch the environment kernelexec is tested in.
# Each venv also gets ipykernel (its kernels run there) and matplotlib (the rich-output tests).

gateway_install() {
  local name pkg
  for name in kg eg; do
    case $name in
      kg) pkg=jupyter-kernel-gateway ;;
      eg) pkg=jupyter-enterprise-gateway ;;
    esac
    if [ ! -x ".venv-$name/bin/python" ]; then
      kx_venv ".venv-$name" || return 1
    fi
    kx_install ".venv-$name/bin/python" "$pkg" ipykernel matplotlib || return 1
  done
  .venv-kg/bin/jupyter-kernelgateway --version
  .venv-eg/bin/jupyter-enterprisegateway --version
}
