#!/bin/sh
# make test-gpu-mig: converge a real MIG-capable GPU, check it, prove the isolation, and
# put everything back. For an operator's own GPU instance (H100/H200, A100, B200, RTX
# PRO 6000), as root; it CHANGES the GPU (MIG mode, instances), so never run it on a
# machine whose settings must stay as they are. Finishes in under 8 minutes or stops.
#
#   sudo make test-gpu-mig                 # GPU 0
#   sudo GPU=3 make test-gpu-mig           # another GPU
#
# Steps: record the GPU's state; apply two slices of the smallest profile; check them
# with `nvidia-smi mig -lgi/-lci`; grant each to its own session account; run a CUDA
# process in each slice as its account; prove the other account cannot open it; reclaim
# both (accounts and device access gone); restore the recorded state.
set -eu

GPU="${GPU:-0}"
PY="${PY:-.venv/bin/python}"
DEADLINE_S="${DEADLINE_S:-480}"
work="$(mktemp -d)"
state_dir="$work/state"
mkdir -p "$state_dir"
started="$(date +%s)"

say() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
agent() { timeout 300 "$PY" -m host_agent --instance-id "i-gpu-mig-check" "$@"; }
in_time() { [ $(( $(date +%s) - started )) -lt "$DEADLINE_S" ] || fail "over ${DEADLINE_S}s"; }

[ "$(id -u)" = 0 ] || fail "run as root (MIG changes, accounts and device files need it)"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: not a GPU host"
"$PY" -c "import host_agent" 2>/dev/null || fail "$PY cannot import host_agent (make install first)"

# 1. What to restore.
agent export > "$work/original.json" || fail "export of the current state failed"
"$PY" -c "import json,sys; json.dump(json.load(open(sys.argv[1]))['spec'], open(sys.argv[2],'w'))" \
  "$work/original.json" "$work/original-spec.json"
say "recorded the current state of every GPU"

restore() {
  say "restoring the recorded state"
  agent apply --spec "$work/original-spec.json" > "$work/restore.json" 2>&1 \
    || say "restore did not converge: see $work/restore.json (the GPU may need: sudo $PY -m host_agent apply --spec $work/original-spec.json)"
}
trap restore EXIT

# 2. Two slices of the card's smallest plain profile on GPU $GPU.
profile="$("$PY" - "$GPU" <<'EOF'
import sys
from calque import catalog
from host_agent.nvml import NvmlBackend
b = NvmlBackend(allow_changes=False)
with b.session():
    card = catalog.card_for_nvml_name(b.gpu(int(sys.argv[1])).name)
if card is None or not card.mig_capable:
    sys.exit("GPU is not a MIG-capable card the catalog knows")
print(next(p.name for p in card.mig_profiles if not p.media_extensions))
EOF
)" || fail "cannot pick a profile for GPU $GPU"
printf '{"version":"v1","gpus":[{"devices":[%s],"mig":{"%s":2}}]}' "$GPU" "$profile" > "$work/spec.json"
say "applying 2 x $profile on GPU $GPU"
agent apply --spec "$work/spec.json" > "$work/apply.json" || fail "apply: $(cat "$work/apply.json")"
agent assert --spec "$work/spec.json" > /dev/null || fail "assert after apply found a difference"
in_time

# 3. What nvidia-smi sees.
gis="$(nvidia-smi mig -i "$GPU" -lgi | grep -c "MIG $profile" || true)"
cis="$(nvidia-smi mig -i "$GPU" -lci | grep -c "MIG $profile" || true)"
[ "$gis" = 2 ] || fail "nvidia-smi mig -lgi lists $gis GPU instances of $profile, wanted 2"
[ "$cis" -ge 2 ] || fail "nvidia-smi mig -lci lists $cis compute instances, wanted 2"
say "nvidia-smi: 2 GPU instances, each with its compute instance"

# 4. Each slice to its own session account.
a=calque-0000000000a1
b=calque-0000000000b2
s0="g$GPU-$profile-0"
s1="g$GPU-$profile-1"
agent grant --slice "$s0" --user "$a" > "$work/grant0.json" || fail "grant $s0"
agent grant --slice "$s1" --user "$b" > "$work/grant1.json" || fail "grant $s1"
uuid_of() {
  "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(next(s['device_uuid'] for s in r['slices'] if s['slice_id']==sys.argv[2]))" "$1" "$2"
}
u0="$(uuid_of "$work/grant0.json" "$s0")"
u1="$(uuid_of "$work/grant1.json" "$s1")"
in_time

# 5. A CUDA process in each slice, as its account: cuInit and one visible device.
cuda_devices() {
  runuser -u "$1" -- env CUDA_VISIBLE_DEVICES="$2" python3 -c '
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
rc = cuda.cuInit(0)
n = ctypes.c_int(0)
if rc == 0:
    cuda.cuDeviceGetCount(ctypes.byref(n))
print(n.value)
' 2>/dev/null || echo 0
}
[ "$(cuda_devices "$a" "$u0")" = 1 ] || fail "$a cannot use its own slice $s0"
[ "$(cuda_devices "$b" "$u1")" = 1 ] || fail "$b cannot use its own slice $s1"
say "each account runs CUDA on its own slice"

# 6. Neither may open the other's.
[ "$(cuda_devices "$a" "$u1")" = 0 ] || fail "$a could open $b's slice $s1"
[ "$(cuda_devices "$b" "$u0")" = 0 ] || fail "$b could open $a's slice $s0"
say "neither account can open the other's slice"
# IMDS: root only.
if runuser -u "$a" -- curl -s -m 2 -o /dev/null http://169.254.169.254/latest/api/token -X PUT \
  -H 'X-aws-ec2-metadata-token-ttl-seconds: 10'; then
  fail "$a reached the instance metadata service"
fi
say "the instance metadata service refuses the session accounts"
in_time

# 7. Reclaim: processes stopped, access and accounts gone.
agent reclaim --slice "$s0" > /dev/null || fail "reclaim $s0"
agent reclaim --slice "$s1" > /dev/null || fail "reclaim $s1"
if id "$a" >/dev/null 2>&1 || id "$b" >/dev/null 2>&1; then fail "a session account outlived reclaim"; fi
say "reclaimed both slices; their accounts are gone"
in_time

# 8. Restore (the EXIT trap), then say how long it took.
trap - EXIT
restore
say "done in $(( $(date +%s) - started ))s"
