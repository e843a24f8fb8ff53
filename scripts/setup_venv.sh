#!/usr/bin/env bash
# Create (or repair) the course's virtual environment; called by `make lab` and `make test`.
# usage: scripts/setup_venv.sh PYTHON VENV "TORCH_REQUIREMENT"
#
# The venv is trusted only when it carries the stamp file written as the very last step, so an
# install that failed half-way is thrown away and rebuilt by the next run.
set -euo pipefail
python="$1"; venv="$2"; torch_requirement="$3"
stamp="$venv/.gpulab-ready"
min_torch="2.13"   # the torch the course is tested with (gpulab/device/preflight.py: TORCH_FLOOR)

die() { printf '\nmake: %s\n\n' "$*" >&2; exit 1; }

if ! command -v "$python" >/dev/null 2>&1; then
    die "no Python found at '$python'. Install Python 3.10 or newer with its venv module
      (Debian/Ubuntu: sudo apt install python3 python3-venv; macOS: brew install python@3.12),
      or point make at one: make test PYTHON=/path/to/python3.11"
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    die "$("$python" --version 2>&1 || echo "$python") is too old: the course needs Python 3.10 or newer.
      Install one and run: make test PYTHON=/path/to/python3.11"
fi
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    die "$python has no working venv module (it cannot make virtual environments).
      Debian/Ubuntu: sudo apt install python3-venv; or use another Python: make test PYTHON=..."
fi

if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    exit 0  # ready and up to date
fi

created=no
if [ ! -f "$stamp" ] && [ -e "$venv" ]; then
    echo "setup: $venv has no ready stamp (an earlier install stopped half-way): rebuilding it"
    rm -rf "$venv"
fi
if [ ! -e "$venv" ]; then
    echo "setup: creating $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
    created=yes
fi
rm -f "$stamp"
on_failure() {
    echo "setup: install failed; nothing is left that the next run would trust" >&2
    [ "$created" = yes ] && rm -rf "$venv"
}
trap on_failure ERR

pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
torch_new_enough() {  # the venv's torch is $min_torch or newer (no torch: no)
    "$venv/bin/python" - "$min_torch" <<'PY' 2>/dev/null
import sys, torch
have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
need = tuple(int(p) for p in sys.argv[1].split("."))
sys.exit(have < need)
PY
}
torch_version() { "$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none; }
if torch_new_enough; then
    echo "setup: keeping the installed torch $(torch_version)"
else
    [ "$(torch_version)" = none ] || echo "setup: torch $(torch_version) is older than $min_torch, the torch the course is tested with"
    echo "setup: installing $torch_requirement"
    # Unquoted on purpose: TORCH may carry pip options, e.g. "torch==2.13.0 --index-url URL".
    # shellcheck disable=SC2086
    "${pip[@]}" install --no-compile $torch_requirement    # compiled below, with the rest
    # Otherwise the course's own torch>=$min_torch would replace it with whatever PyPI has.
    torch_new_enough || { on_failure; die "TORCH=\"$torch_requirement\" installed torch $(torch_version); the course needs
      torch $min_torch or newer, e.g. TORCH=\"torch==$min_torch.0 --index-url https://download.pytorch.org/whl/cu126\""; }
fi
echo "setup: installing the course and its tools"
# deepspeed (chapter 09) ships an sdist: built without compiled ops, which it JIT-compiles on a
# GPU when used; its torch requirement is met by the torch above, so no CUDA build is pulled.
export DS_BUILD_OPS=0
# uv fetches and installs the ~180 packages in parallel, several times faster than pip. It reads
# no pip configuration (an index or mirror set in pip.conf), so where it cannot be had or cannot
# install, pip does it.
if "${pip[@]}" install uv 2>/dev/null &&
   "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" -e ".[test]"; then
    echo "setup: installed with uv"
else
    "${pip[@]}" install --no-compile -e ".[test]"
fi
# Bytecode, once for everything, on every core: the grading sandbox's kernels (and a shared
# workshop venv's) import from a venv they cannot write, and would compile each module they
# import at every start. Not the packages' own tests, nor the ~400 model families transformers
# ships (the course imports only its Trainer, which loads models.auto): 73 of the 252 MB of
# source, so 108 -> about 77 CPU-s. Not checked: torch ships a test file only Python 3.12 parses.
"$venv/bin/python" -m compileall -q -j 0 -x '/tests?/|/torch/testing/_internal/|/transformers/models/(?!auto/)[^/]+/' \
    "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
# rfc3987-syntax (pulled in by jsonschema[format-nongpl]) builds ~35 Lark parsers when imported,
# 1-3 s of CPU in every process that imports nbformat or starts a Jupyter server (each nbgrader
# command, each JupyterLab). jsonschema uses it only for the "iri" formats, which no Jupyter or
# nbgrader schema uses, and skips them without it (jupyter-server/jupyter_server#1559,
# python-jsonschema/jsonschema#1428).
"${pip[@]}" uninstall --yes rfc3987-syntax 2>/dev/null || true

# nbgrader's wheel switches its server and lab extensions on by itself, at the venv's level
# (etc/jupyter/jupyter_server_config.d/nbgrader.json); the nine `jupyter ... enable` calls that
# said it again here took about 20 s of every setup. The browser tests open the Formgrader.

touch "$stamp"
echo "setup: $venv is ready"
