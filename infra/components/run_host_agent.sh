# Runs the calque host agent on this instance (an aws:runShellScript step of the
# calque SSM Command document). The agent bundle was downloaded by the step before.
# Placeholders __LIKE_THIS__ are filled at synth from infra/constants.py and
# calque.resources.SSM_DOCUMENT_PARAMETERS.
set -euo pipefail
umask 022

# Parameter values arrive as environment variables (interpolationType ENV_VAR), never
# pasted into this script. Agents older than 3.3.2746 lack that: their values are
# pasted between single quotes, which the parameters' allowedPattern keeps out.
verb='{{ __P_VERB__ }}'
if [ -n "${SSM___P_SPEC__+x}" ]; then spec="$SSM___P_SPEC__"; else spec='{{ __P_SPEC__ }}'; fi
if [ -n "${SSM___P_SLICE__+x}" ]; then slice_id="$SSM___P_SLICE__"; else slice_id='{{ __P_SLICE__ }}'; fi
if [ -n "${SSM___P_FENCE__+x}" ]; then fence="$SSM___P_FENCE__"; else fence='{{ __P_FENCE__ }}'; fi
if [ -n "${SSM___P_REPORT__+x}" ]; then report_to="$SSM___P_REPORT__"; else report_to='{{ __P_REPORT__ }}'; fi

home='__ROOT__/__VERSION__'
download='__DOWNLOAD__'

fail() { echo "calque host agent: $*" >&2; exit 2; }

install_agent() {
  local staging="$home.partial" bundle="$download"
  if [ -d "$bundle" ]; then bundle="$(find "$bundle" -maxdepth 1 -type f -name '*.zip' | head -n 1)"; fi
  [ -n "$bundle" ] && [ -f "$bundle" ] || fail "agent bundle not found under $download"
  command -v python3 >/dev/null || fail "python3 is required on the instance"
  rm -rf "$staging"
  mkdir -p "$staging"
  python3 -m zipfile -e "$bundle" "$staging/src"
  # A private environment for the agent's dependencies: a venv where the OS allows one,
  # else a plain target directory. Either needs pip's index (PyPI or PIP_INDEX_URL).
  if python3 -m venv "$staging/venv" >/dev/null 2>&1; then
    "$staging/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      -r "$staging/src/requirements.txt"
  else
    python3 -m pip install --quiet --disable-pip-version-check --target "$staging/site" \
      -r "$staging/src/requirements.txt" || fail "neither python3 -m venv nor python3 -m pip works here"
  fi
  rm -rf "$home"
  mv "$staging" "$home"
  # Older agent versions are of no further use.
  find "$(dirname "$home")" -mindepth 1 -maxdepth 1 -type d ! -name "$(basename "$home")" \
    -exec rm -rf {} +
}

[ -d "$home/src" ] || install_agent
if [ -x "$home/venv/bin/python" ]; then
  python="$home/venv/bin/python"; export PYTHONPATH="$home/src"
else
  python=python3; export PYTHONPATH="$home/src:$home/site"
fi

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
args=(--instance-id "$instance_id")
if [ -n "$report_to" ]; then args+=(--report-to "$report_to"); fi
args+=("$verb")
case "$verb" in
  apply|assert)
    [ -n "$spec" ] || fail "$verb needs the __P_SPEC__ parameter (the layout spec)"
    printf '%s' "$spec" > "$work/spec.json"
    args+=(--spec "$work/spec.json")
    ;;
  reclaim)
    [ -n "$slice_id" ] || fail "reclaim needs the __P_SLICE__ parameter"
    args+=(--slice "$slice_id")
    if [ -n "$fence" ]; then args+=(--fence "$fence"); fi
    ;;
esac
"$python" -m host_agent "${args[@]}"
