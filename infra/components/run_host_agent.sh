# Runs the calque host agent on this instance (an aws:runShellScript step of the
# calque SSM Command document). It installs the agent bundle first when this version is not
# installed yet, from the presigned URL the control plane sends.
# Placeholders __LIKE_THIS__ are filled at synth from infra/constants.py and
# calque.resources.SSM_DOCUMENT_PARAMETERS.
#
# SSM Agent writes these lines to a file and runs it with `sh`: dash on Ubuntu, bash on
# Amazon Linux. So this is POSIX sh only (no pipefail, no arrays, no `local`), and the
# tests run it under both. Nothing here reaches the internet: the interpreter is the
# system python3 (3.9 or later) and the agent's dependencies are wheels in the bundle.
set -eu
umask 022

# Parameter values arrive as environment variables (interpolationType ENV_VAR), never
# pasted into this script. Agents older than 3.3.2746 lack that: their values are
# pasted between single quotes, which the parameters' allowedPattern keeps out.
verb='{{ __P_VERB__ }}'
if [ -n "${SSM___P_SPEC__+x}" ]; then spec="$SSM___P_SPEC__"; else spec='{{ __P_SPEC__ }}'; fi
if [ -n "${SSM___P_SLICE__+x}" ]; then slice_id="$SSM___P_SLICE__"; else slice_id='{{ __P_SLICE__ }}'; fi
if [ -n "${SSM___P_FENCE__+x}" ]; then fence="$SSM___P_FENCE__"; else fence='{{ __P_FENCE__ }}'; fi
if [ -n "${SSM___P_REPORT__+x}" ]; then report_to="$SSM___P_REPORT__"; else report_to='{{ __P_REPORT__ }}'; fi
if [ -n "${SSM___P_USER__+x}" ]; then session_user="$SSM___P_USER__"; else session_user='{{ __P_USER__ }}'; fi
if [ -n "${SSM___P_TOKEN__+x}" ]; then token_sha256="$SSM___P_TOKEN__"; else token_sha256='{{ __P_TOKEN__ }}'; fi
if [ -n "${SSM___P_WACTION__+x}" ]; then worker_action="$SSM___P_WACTION__"; else worker_action='{{ __P_WACTION__ }}'; fi
if [ -n "${SSM___P_WORKER__+x}" ]; then worker_doc="$SSM___P_WORKER__"; else worker_doc='{{ __P_WORKER__ }}'; fi
if [ -n "${SSM___P_BUNDLE__+x}" ]; then bundle_url="$SSM___P_BUNDLE__"; else bundle_url='{{ __P_BUNDLE__ }}'; fi

root='__ROOT__'
home="$root/__VERSION__"
download='__DOWNLOAD__'

fail() { echo "calque host agent: $*" >&2; exit 2; }

command -v python3 >/dev/null 2>&1 || fail "python3 is required on the instance (3.9 or later)"
# Which wheels fit this interpreter and machine: cp39-x86_64, cp312-aarch64, ...
tag="$(python3 -c 'import platform, sys; print("cp%d%d-%s" % (sys.version_info[0], sys.version_info[1], platform.machine()))')" \
  || fail "python3 does not run"
case "$tag" in
  cp2*|cp30-*|cp31-*|cp32-*|cp33-*|cp34-*|cp35-*|cp36-*|cp37-*|cp38-*)
    fail "python3 is too old ($tag); the agent needs Python 3.9 or later" ;;
esac

# The bundle is downloaded only when this version is not installed: from the presigned URL
# the control plane sends with every command, into the version's own download directory.
fetch_bundle() {
  [ -n "$bundle_url" ] || return 0
  mkdir -p "$download"
  if [ -n "$(find "$download" -maxdepth 1 -type f -name '*.zip' 2>/dev/null | head -n 1)" ]; then return 0; fi
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --retry 3 --max-time 600 -o "$download/bundle.zip.part" "$bundle_url" \
      || fail "could not download the agent bundle (curl: $?)"
  else
    python3 -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=600) as r, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(r, out)' "$bundle_url" "$download/bundle.zip.part" \
      || fail "could not download the agent bundle"
  fi
  mv "$download/bundle.zip.part" "$download/bundle.zip"
}

install_agent() {
  staging="$home.partial"
  fetch_bundle
  bundle="$download"
  if [ -d "$bundle" ]; then bundle="$(find "$bundle" -maxdepth 1 -type f -name '*.zip' | head -n 1)"; fi
  if [ -z "$bundle" ] || [ ! -f "$bundle" ]; then
    fail "agent bundle not found under $download, and no bundle URL was sent to download it"
  fi
  rm -rf "$staging"
  mkdir -p "$staging"
  python3 -m zipfile -e "$bundle" "$staging/src"
  # The dependencies: wheels built into the bundle for each supported Python and machine
  # (wheelhouse/<tag>.txt names them, wheelhouse/files/ holds each once), unpacked as they
  # are: a wheel is a zip of its installed files. No pip, no index.
  manifest="$staging/src/wheelhouse/$tag.txt"
  if [ ! -f "$manifest" ]; then
    fail "the bundle has no wheels for $tag; it has: $(cd "$staging/src/wheelhouse" 2>/dev/null && ls -- *.txt | tr '\n' ' ')"
  fi
  mkdir -p "$staging/site"
  while IFS= read -r wheel || [ -n "$wheel" ]; do
    [ -n "$wheel" ] || continue
    python3 -m zipfile -e "$staging/src/wheelhouse/files/$wheel" "$staging/site"
  done < "$manifest"
  rm -rf "$staging/src/wheelhouse"
  printf '%s\n' "$tag" > "$staging/tag"
  rm -rf "$home"
  mv "$staging" "$home"
  # Both commands below run as root from whatever directory they are started in (a host admin's
  # shell may stand in a tenant's home): `python3 -m` would import from that directory first,
  # so the agent is run with the working directory taken off the module path.
  run_main='import runpy, sys; del sys.path[0]; runpy.run_module("host_agent", run_name="__main__", alter_sys=True)'
  # What the Session Manager document runs (as root) when a member connects: asks for the
  # session's token, then a login shell in the session's account (or, given a second
  # argument, the base64 command `calque session exec` sent, run there instead).
  {
    echo '#!/bin/sh'
    echo "PYTHONPATH='$home/src:$home/site' exec python3 -c '$run_main' login --user \"\$1\" --command-b64 \"\${2:-}\""
  } > "$root/login.$$"
  chmod 0755 "$root/login.$$"
  mv -f "$root/login.$$" "$root/login"
  # What a host admin runs by hand (as root): the installed agent with its own dependencies,
  # e.g. `/opt/calque/agent/host-agent --output text export`.
  {
    echo '#!/bin/sh'
    echo "PYTHONPATH='$home/src:$home/site' exec python3 -c '$run_main' \"\$@\""
  } > "$root/host-agent.$$"
  chmod 0755 "$root/host-agent.$$"
  mv -f "$root/host-agent.$$" "$root/host-agent"
  # Older agent versions go once no process runs from them (pool workers started by one
  # still import from its directory).
  PYTHONPATH="$home/src:$home/site" python3 -m host_agent.versions "$root" "$home" || true
}

installed() { [ -d "$home/src" ] && [ -f "$home/tag" ] && [ "$(cat "$home/tag")" = "$tag" ]; }

# First run: one install at a time, however many commands SSM runs at once.
if ! installed; then
  mkdir -p "$root"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$root/install.lock"
    flock -w 600 9 || fail "another run has been installing the agent for 10 minutes"
    installed || install_agent
    flock -u 9
    exec 9>&-
  else
    until mkdir "$root/install.lock.d" 2>/dev/null; do sleep 1; done
    trap 'rmdir "$root/install.lock.d" 2>/dev/null || true' EXIT
    installed || install_agent
    rmdir "$root/install.lock.d"
    trap - EXIT
  fi
fi
PYTHONPATH="$home/src:$home/site"
export PYTHONPATH

instance_id="${AWS_SSM_INSTANCE_ID:-}"
if [ -z "$instance_id" ]; then
  token="$(curl -sf -X PUT http://169.254.169.254/latest/api/token \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' || true)"
  instance_id="$(curl -sf -H "X-aws-ec2-metadata-token: $token" \
    http://169.254.169.254/latest/meta-data/instance-id || true)"
fi
[ -n "$instance_id" ] || fail "cannot tell this instance's id"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The agent's arguments, built up in the positional parameters (sh has no arrays).
set -- --instance-id "$instance_id"
if [ -n "$report_to" ]; then set -- "$@" --report-to "$report_to"; fi
set -- "$@" "$verb"
case "$verb" in
  apply|assert)
    [ -n "$spec" ] || fail "$verb needs the __P_SPEC__ parameter (the layout spec)"
    printf '%s' "$spec" > "$work/spec.json"
    set -- "$@" --spec "$work/spec.json"
    ;;
  reclaim)
    [ -n "$slice_id" ] || fail "reclaim needs the __P_SLICE__ parameter"
    set -- "$@" --slice "$slice_id"
    if [ -n "$fence" ]; then set -- "$@" --fence "$fence"; fi
    ;;
  grant)
    [ -n "$slice_id" ] || fail "grant needs the __P_SLICE__ parameter"
    [ -n "$session_user" ] || fail "grant needs the __P_USER__ parameter"
    set -- "$@" --slice "$slice_id" --user "$session_user"
    if [ -n "$token_sha256" ]; then set -- "$@" --token-sha256 "$token_sha256"; fi
    if [ -n "$fence" ]; then set -- "$@" --fence "$fence"; fi
    ;;
  worker)
    # A warm pool's workers: started as their own supervised processes (systemd units), so
    # they outlive this command. start needs the pool's worker document; its layout (spec)
    # is applied first when given.
    case "$worker_action" in
      start)
        [ -n "$worker_doc" ] || fail "worker start needs the __P_WORKER__ parameter (the pool's worker document)"
        printf '%s' "$worker_doc" > "$work/worker.json"
        set -- "$@" start --worker "$work/worker.json"
        if [ -n "$spec" ]; then
          printf '%s' "$spec" > "$work/spec.json"
          set -- "$@" --spec "$work/spec.json"
        fi
        ;;
      stop|status)
        set -- "$@" "$worker_action"
        if [ -n "$worker_doc" ]; then
          pool="$(printf '%s' "$worker_doc" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("pool", ""))')" \
            || fail "the __P_WORKER__ parameter is not a JSON document"
          [ -n "$pool" ] && set -- "$@" --pool "$pool"
        fi
        ;;
      *) fail "worker needs the __P_WACTION__ parameter: start, stop or status" ;;
    esac
    ;;
esac
python3 -m host_agent "$@"
