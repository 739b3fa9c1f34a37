# Shared helpers for scripts/*: find or install what the scripts need.
# shellcheck shell=bash

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: Rust is not installed. Install it with rustup (https://rustup.rs):" >&2
        echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
        echo "then open a new shell and run this script again." >&2
        exit 1
    fi
    local have need=1.88
    have=$(rustc --version | awk '{print $2}')
    if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
        echo "error: rustc $have is too old; gpux needs $need or newer (rustup update stable)." >&2
        exit 1
    fi
}

# ensure_component NAME CHECK...: installs a rustup component when CHECK fails.
ensure_component() {
    local name=$1
    shift
    if ! "$@" >/dev/null 2>&1; then
        say "installing rustup component $name"
        rustup component add "$name"
    fi
}

# ensure_cargo_tool BINARY CRATE [VERSION]: installs a cargo subcommand when missing.
ensure_cargo_tool() {
    local bin=$1 crate=$2 version=${3:-}
    if ! command -v "$bin" >/dev/null 2>&1; then
        say "installing $crate (once; takes a few minutes)"
        if [ -n "$version" ]; then
            cargo install --locked "$crate" --version "$version"
        else
            cargo install --locked "$crate"
        fi
    fi
}

# apt_install PACKAGE...: Debian packages, with sudo when not root; the package lists are
# refreshed once if the first try fails.
apt_install() {
    local sudo=
    if [ "$(id -u)" -ne 0 ]; then
        sudo=sudo
    fi
    if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; then
        $sudo apt-get update
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
    fi
}

# ensure_busybox: the testnet's workload image is `FROM scratch` with Debian's static busybox
# at /bin/busybox; installs busybox-static when it is missing or dynamically linked.
ensure_busybox() {
    if [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; then
        return 0
    fi
    say "installing Debian's busybox-static (for the workload image)"
    apt_install busybox-static
}

# ensure_netns_tools: the isolated testnet (`gpux testnet up --isolated`) makes network
# namespaces, veth pairs and a bridge (iproute2), shapes and cuts links (iptables, tc) and
# starts nodes in their namespaces (nsenter, util-linux).
ensure_netns_tools() {
    if command -v ip >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1 \
        && command -v tc >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1; then
        return 0
    fi
    say "installing iproute2, iptables and util-linux (for the isolated testnet)"
    apt_install iproute2 iptables util-linux
}

# ensure_promtool: Prometheus' promtool checks the /metrics output, the alert rules and their
# unit tests (Debian's prometheus package; its service is not started).
ensure_promtool() {
    if command -v promtool >/dev/null 2>&1; then
        return 0
    fi
    say "installing Debian's prometheus (for promtool)"
    apt_install prometheus
}

# ensure_nvrtc: NVIDIA's NVRTC (and the CUDA headers it includes) from PyPI, pinned, in a
# virtual environment under target/tools (no GPU or CUDA toolkit needed): scripts/ptx
# compiles the challenge's CUDA kernels to PTX with it. Sets NVRTC_PYTHON and NVRTC_SITE.
NVRTC_VERSION=12.2.140
ensure_nvrtc() {
    local venv="${CARGO_TARGET_DIR:-$PWD/target}/tools/nvrtc-$NVRTC_VERSION"
    NVRTC_PYTHON="$venv/bin/python"
    if [ ! -x "$NVRTC_PYTHON" ] || ! "$NVRTC_PYTHON" -c "import nvidia.cuda_nvrtc" 2>/dev/null; then
        say "installing NVIDIA's NVRTC $NVRTC_VERSION from PyPI (to compile the CUDA kernels to PTX)"
        if ! python3 -m venv "$venv" 2>/dev/null; then
            apt_install python3-venv
            python3 -m venv "$venv"
        fi
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION" \
            "nvidia-cuda-nvcc-cu12==$NVRTC_VERSION" \
            "nvidia-cuda-runtime-cu12==$NVRTC_VERSION"
    fi
    NVRTC_SITE=$("$NVRTC_PYTHON" -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))")
    export NVRTC_PYTHON NVRTC_SITE
}

# ensure_systemd_analyze: the tests check `gpux host install`'s unit with systemd-analyze
# verify (Debian's systemd package; nothing is started).
ensure_systemd_analyze() {
    if command -v systemd-analyze >/dev/null 2>&1; then
        return 0
    fi
    say "installing Debian's systemd (for systemd-analyze verify)"
    apt_install systemd
}

# ensure_chromium: the console's tests drive Debian's chromium headless over WebDriver
# (chromedriver, from chromium-driver).
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        return 0
    fi
    say "installing Debian's chromium and chromium-driver (for the console's browser tests)"
    apt_install chromium chromium-driver
}

# ensure_workspace_tools: a lease's workspace is a loop-mounted ext4 image (mkfs.ext4 from
# e2fsprogs, fallocate and mount from util-linux); installs e2fsprogs when it is missing.
ensure_workspace_tools() {
    if command -v mkfs.ext4 >/dev/null 2>&1 || [ -x /sbin/mkfs.ext4 ] || [ -x /usr/sbin/mkfs.ext4 ]; then
        return 0
    fi
    say "installing e2fsprogs (mkfs.ext4, for lease workspaces)"
    apt_install e2fsprogs
}

# ensure_cxx: attestation's tests compile the CUDA kernels' BLAKE3 (attestation/cuda/
# blake3.cuh) as C++ on the host and check it against the blake3 crate.
ensure_cxx() {
    if command -v c++ >/dev/null 2>&1; then
        return 0
    fi
    say "installing g++ (to check the CUDA kernels' hashing on the CPU)"
    apt_install g++
}

# ensure_registry: the tests and the testnet pull images from a real registry on loopback
# (Debian's docker-registry, with TLS from openssl and basic auth from apache2-utils'
# htpasswd). Only installed: each test starts its own registry process.
ensure_registry() {
    if command -v docker-registry >/dev/null 2>&1 && command -v htpasswd >/dev/null 2>&1 \
        && command -v openssl >/dev/null 2>&1; then
        return 0
    fi
    say "installing Debian's docker-registry, apache2-utils and openssl (a registry for the tests and the testnet)"
    apt_install docker-registry apache2-utils openssl
}

# ensure_openssh_client: `gpux ssh` runs this machine's OpenSSH client (ssh, scp,
# ssh-keygen); the SSH tests and the testnet use it into leases.
ensure_openssh_client() {
    if command -v ssh >/dev/null 2>&1 && command -v scp >/dev/null 2>&1 \
        && command -v ssh-keygen >/dev/null 2>&1; then
        return 0
    fi
    say "installing openssh-client (ssh, scp and ssh-keygen, for gpux ssh)"
    apt_install openssh-client
}

# The lease tests and the testnet run containers: a Docker daemon must be running.
ensure_docker() {
    if ! command -v docker >/dev/null 2>&1; then
        say "Docker is not installed: install Docker Engine (e.g. apt-get install docker.io) and start it"
        exit 1
    fi
    if ! docker info >/dev/null 2>&1; then
        say "the Docker daemon is not reachable (docker info fails): start it (e.g. systemctl start docker) or set DOCKER_HOST"
        exit 1
    fi
}

# stage NAME: announces a stage and prints how long the previous one took; `stage ""` ends
# the last one (and prints the total).
STAGE_NAME=""
STAGE_START=$(date +%s)
TOTAL_START=$STAGE_START
stage() {
    local now
    now=$(date +%s)
    if [ -n "$STAGE_NAME" ]; then
        printf '\033[1m==> %s: %ds\033[0m\n' "$STAGE_NAME" $((now - STAGE_START)) >&2
    fi
    STAGE_NAME=$1
    STAGE_START=$now
    if [ -n "$1" ]; then
        say "$1"
    else
        printf '\033[1m==> total: %ds\033[0m\n' $((now - TOTAL_START)) >&2
    fi
}
