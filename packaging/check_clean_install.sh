#!/usr/bin/env bash
# Does the README's apt line suffice on a bare Debian or Ubuntu? (issue 19, docs/install-check.md)
#
#   sudo packaging/check_clean_install.sh SUITE ROOT [MIRROR]
#   e.g. sudo packaging/check_clean_install.sh bookworm /var/tmp/clean-bookworm
#        sudo DEBOOTSTRAP_OPTS=--keyring=/path/ubuntu-archive-keyring.gpg \
#             packaging/check_clean_install.sh noble /var/tmp/clean-noble
#
# Builds a minimal root with debootstrap (--variant=minbase, unless ROOT already holds one),
# installs ONLY the README's non-optional apt lines (read from the README of this commit,
# --no-install-recommends), clones this repository's HEAD into it for an unprivileged user,
# runs `make setup` there (the real engine build, from PyPI), then, against an Xvfb + openbox
# started on the HOST (so that the test tools' own dependencies cannot hide a missing
# package in the root), `make run` with QT_QPA_PLATFORM=xcb, `moescope --self-test` and a
# mid-answer screenshot. Reports the libraries Qt's xcb plugin cannot find, the packages
# the running window maps, and which README packages it never maps.
# Needs root, network, debootstrap, Xvfb and openbox on the host, about 1.5 GB and ~10 min
# on 2 cores. Never part of `make test`. Results (logs, PNGs) go to $OUT
# (default /var/tmp/moescope-clean-install/SUITE). Mounts are undone on exit.
set -euo pipefail

suite=${1:?usage: check_clean_install.sh SUITE ROOT [MIRROR]}
root=${2:?usage: check_clean_install.sh SUITE ROOT [MIRROR]}
mirror=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/var/tmp/moescope-clean-install/$suite}
user=newuser
[ "$(id -u)" = 0 ] || { echo "needs root (debootstrap, chroot, mounts)"; exit 2; }
case $suite in
    focal|jammy|noble|oracular|plucky|questing)
        ubuntu=1; mirror=${mirror:-http://archive.ubuntu.com/ubuntu} ;;
    *) ubuntu=0; mirror=${mirror:-http://deb.debian.org/debian} ;;
esac
mkdir -p "$out"
ca_env=
log() { echo "== $*" | tee -a "$out/summary.txt"; }
: > "$out/summary.txt"

if [ ! -e "$root/etc/os-release" ]; then
    script=/usr/share/debootstrap/scripts/$suite
    # an older debootstrap lacks newer Ubuntu suites; they all use the gutsy script
    [ -e "$script" ] || { [ $ubuntu = 1 ] && script=/usr/share/debootstrap/scripts/gutsy; }
    # shellcheck disable=SC2086
    debootstrap --variant=minbase ${DEBOOTSTRAP_OPTS:-} "$suite" "$root" "$mirror" "$script"
fi

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for m in tmp/.X11-unix dev sys proc; do
        mountpoint -q "$root/$m" && umount -R "$root/$m"
    done
    return 0
}
trap cleanup EXIT
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/sys" || mount -t sysfs sys "$root/sys"
mountpoint -q "$root/dev" || { mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"; }
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

if [ $ubuntu = 1 ]; then
    printf 'deb %s %s main universe\n' "$mirror" "$suite" "$mirror" "$suite-updates" \
        "$mirror" "$suite-security" \
        > "$root/etc/apt/sources.list"
else
    { printf 'deb %s %s main\n' "$mirror" "$suite" "$mirror" "$suite-updates"
      echo "deb http://deb.debian.org/debian-security $suite-security main"; } \
        > "$root/etc/apt/sources.list"
fi
log "$(. "$root/etc/os-release"; echo "$PRETTY_NAME") (debootstrap minbase) in $root, $(date -u +%F)"

# The README's "System packages" block: every `sudo apt-get install` not marked optional.
readme_packages() {
    awk '/^### System packages/ {s=1; next}
         s && /^```bash/ {b=1; next}
         b && /^```/ {exit}
         b { l = l $0; if (sub(/\\[ \t]*$/, "", l)) next
             if (l ~ /^sudo apt-get install/ && l !~ /# *optional/) {
                 sub(/#.*/, "", l); sub(/^sudo apt-get install/, "", l); printf "%s ", l }
             l = "" }' "$1"
}
pkgs=$(git -C "$repo" show HEAD:README.md > "$out/README.md" && readme_packages "$out/README.md")
[ -n "${pkgs// /}" ] || { echo "no apt-get install line found in the README"; exit 2; }
log "apt-get install --no-install-recommends $pkgs"
in_root apt-get update -q > "$out/apt.log" 2>&1
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    $pkgs >> "$out/apt.log" 2>&1 || { tail -20 "$out/apt.log"; exit 1; }
in_root dpkg-query -W -f '${Package} ${Version}\n' > "$out/dpkg-list.txt"
# A network that intercepts TLS (this host's) needs its CA in the root, as the user's own
# machine on that network would have it; pip's certifi does not read the system store.
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    in_root update-ca-certificates > /dev/null 2>&1
    ca_env=PIP_CERT=/etc/ssl/certs/ca-certificates.crt
    log "test harness: the host's local CAs copied into the root, $ca_env"
fi
log "$(wc -l < "$out/dpkg-list.txt") packages installed in the root"

in_root id "$user" >/dev/null 2>&1 || in_root useradd -m -s /bin/bash "$user"
home=$root/home/$user
rm -rf "$home/moescope"
git clone -q --no-local "$repo" "$home/moescope"
chown -R "$(in_root id -u "$user"):$(in_root id -g "$user")" "$home"
log "clone of $(git -C "$repo" rev-parse --short HEAD) ($(git -C "$repo" rev-parse --abbrev-ref HEAD))"
as_user() {
    chroot --userspec="$user:$user" "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME="/home/$user" \
        LANG=C.UTF-8 USER="$user" ${DISPLAY_IN_ROOT:+DISPLAY=$DISPLAY_IN_ROOT} ${ca_env:-} "$@"
}

start=$(date +%s)
if ! as_user bash -c "cd ~/moescope && make setup" > "$out/make-setup.log" 2>&1; then
    log "make setup FAILED after $(( $(date +%s) - start )) s:"; tail -25 "$out/make-setup.log" | tee -a "$out/summary.txt"
    exit 1
fi
log "make setup: OK in $(( $(date +%s) - start )) s ($(grep -o 'backend: [a-z]*' "$out/make-setup.log" | tail -1))"

plugin=$(ls "$home"/moescope/.venv/lib/python3*/site-packages/PySide6/Qt/plugins/platforms/libqxcb.so)
qtlib=$(dirname "$plugin")/../../lib
libs=("$plugin" "$qtlib"/libQt6{XcbQpa,Core,Gui,Widgets,DBus}.so.6)
missing=$(in_root ldd "${libs[@]#"$root"}" | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
log "ldd libqxcb.so and libQt6{XcbQpa,Core,Gui,Widgets,DBus}.so.6, not found: ${missing:-none}"

# The X server and window manager run on the host: their packages stay out of the root.
d=70; while [ -e "/tmp/.X$d-lock" ] || [ -e "/tmp/.X11-unix/X$d" ]; do d=$((d + 1)); done
Xvfb ":$d" -screen 0 1366x768x24 -nolisten tcp > "$out/xvfb.log" 2>&1 & pids+=($!)
for _ in $(seq 50); do [ -e "/tmp/.X11-unix/X$d" ] && break; sleep 0.2; done
DISPLAY=":$d" openbox > "$out/openbox.log" 2>&1 & pids+=($!)
mkdir -p "$root/tmp/.X11-unix"; mount --bind /tmp/.X11-unix "$root/tmp/.X11-unix"
DISPLAY_IN_ROOT=":$d"
export QT_QPA_PLATFORM=xcb

# make run: the window opens with the demo model; grab the screen from a second Qt client.
as_user env QT_QPA_PLATFORM=xcb QT_DEBUG_PLUGINS=1 bash -c "cd ~/moescope && exec make run" \
    > "$out/make-run.log" 2>&1 & run_pid=$!; pids+=("$run_pid")
app_pid=
rootabs=$(readlink -f "$root")
for _ in $(seq 60); do
    sleep 1
    for p in $(pgrep -f 'bin/moescope' || true); do
        [ "$(readlink "/proc/$p/root")" = "$rootabs" ] && app_pid=$p
    done
    [ -n "$app_pid" ] && break
    kill -0 "$run_pid" 2>/dev/null || break
done
[ -n "$app_pid" ] || { log "make run FAILED: no window process"; tail -30 "$out/make-run.log"; exit 1; }
sleep 20  # the demo model loads in about a second; leave room on a loaded machine
kill -0 "$app_pid" 2>/dev/null || { log "make run: the window exited"; tail -30 "$out/make-run.log"; exit 1; }
cp "$repo/packaging/grab_screen.py" "$root/tmp/grab_screen.py"
as_user env QT_QPA_PLATFORM=xcb "/home/$user/moescope/.venv/bin/python" /tmp/grab_screen.py \
    /tmp/make-run.png >> "$out/make-run.log" 2>&1 && cp "$root/tmp/make-run.png" "$out/make-run.png"
log "make run: window up (pid $app_pid), screen grabbed: $(test -s "$out/make-run.png" && echo "$out/make-run.png" || echo FAILED)"

# Which packages does the running window map? Which README packages does it never map?
awk '$6 ~ /\.so/ {print $6}' "/proc/$app_pid/maps" | sort -u > "$out/mapped-libs.txt"
: > "$out/mapped-packages.txt"
while read -r lib; do
    lib=${lib#"$rootabs"}  # the host sees the root's files under their full path
    case $lib in /home/*) continue ;; esac
    in_root dpkg -S "$lib" 2>/dev/null || in_root dpkg -S "${lib/#\/usr\/lib\//\/lib\/}" 2>/dev/null \
        || echo "?: $lib"
done < "$out/mapped-libs.txt" | sed 's/:[^ ]*: .*//; s/: .*//' | sort -u > "$out/mapped-packages.txt"
unmapped=
for p in $pkgs; do grep -qx "$p" "$out/mapped-packages.txt" || unmapped="$unmapped $p"; done
log "README packages the window never maps (python3 and the build tools are expected here):${unmapped:- none}"
kill "$app_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true

if as_user env QT_QPA_PLATFORM=xcb bash -c "cd ~/moescope && .venv/bin/moescope --self-test" \
    > "$out/self-test.log" 2>&1; then log "$(grep 'self-test:' "$out/self-test.log")"
else log "self-test FAILED:"; tail -15 "$out/self-test.log" | tee -a "$out/summary.txt"; exit 1; fi

as_user env QT_QPA_PLATFORM=xcb bash -c \
    "cd ~/moescope && .venv/bin/python packaging/screenshot.py /tmp/answer-1024x700.png --size 1024x700" \
    > "$out/screenshot.log" 2>&1 && cp "$root/tmp/answer-1024x700.png" "$out/"
log "mid-answer screenshot: $(test -s "$out/answer-1024x700.png" && echo "$out/answer-1024x700.png" || echo FAILED)"
log "done in $(( $(date +%s) - start )) s; logs in $out"
