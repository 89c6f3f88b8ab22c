# Sourced by the set-up scripts of tests/support: installs the Debian packages a script needs, only when missing.
#
#   ensure_debian_packages NAME PACKAGE...   # NAME prefixes the messages (on stderr); exits 1 if packages are
#                                            # missing and this is not root (apt-get would fail)

ensure_debian_packages() {
    local name="$1"
    shift
    local missing=() package
    for package in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$package")
        fi
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]]; then
        echo "$name: missing Debian packages ${missing[*]} and not root: install them with apt-get and run again" >&2
        exit 1
    fi
    echo "$name: installing ${missing[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}
