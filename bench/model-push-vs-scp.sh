#!/usr/bin/env bash
# A model pushed to a box (`appliance fleet model push`: HTTPS pinned to the enrolled
# certificate, each chunk hashed and synced by the box before it counts) against `scp` of the
# same file to the same machine (a private sshd on loopback), in one run. The box is a supervisor
# on a simulated board here, so both run over loopback on this machine's cores: the figure is
# what the two protocols cost, not a clinic's Wi-Fi. scp is timed alone and with a `sync` of the
# copy afterwards (the push syncs every chunk before it counts it).
# Prints both rates and the ratio (push rate / scp rate; above 1 means the push is faster).
# Needs sshd (Debian openssh-server). Usage: bench/model-push-vs-scp.sh [SIZE_MIB]  (default 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-1024}
command -v /usr/sbin/sshd > /dev/null || { echo "needs sshd: apt-get install openssh-server" >&2; exit 2; }
cargo build --release --quiet -p supervisor --features sim
cargo build --release --quiet -p operator
sup=$PWD/target/release/supervisor
app=$PWD/target/release/appliance
w=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$w"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One provisioned box, enrolled, trusting the fleet key.
"$sup" weights keygen --out "$w/fleet-key" > /dev/null
hash=$(printf 'bench password' | "$sup" dashboard hash-password)
tokens=$("$sup" dashboard new-token)
token=$(sed -n 's/^token //p' <<< "$tokens")
digest=$(sed -n 's/^sha256 //p' <<< "$tokens")
cat > "$w/fleet.toml" << TOML
[fleet]
name = "bench"
generation = 1

[fleet.defaults]
password_hash = "$hash"
api_token_sha256 = ["$digest"]
fleet_key = "$(cat "$w/fleet-key.pub")"

[[box]]
name = "box"
TOML
"$sup" sim init "$w/box" > /dev/null
mkdir -p "$w/stick"
"$app" usb --fleet "$w/fleet.toml" --box box --key "$w/fleet-key" "$w/stick" > /dev/null
cp "$w/stick/appliance-provision.toml" "$w/box/boot/firmware/"
"$sup" --root "$w/box" provision apply > /dev/null
https=$(port)
cat > "$w/box/etc/appliance/appliance.toml" << TOML
[daemon]
reverify_interval_s = 0

[engine]
port = $(port)

[dashboard]
listen = "127.0.0.1:$(port)"
https_listen = "127.0.0.1:$https"
TOML
"$sup" --root "$w/box" run > "$w/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -sk "https://127.0.0.1:$https/login" > /dev/null && break
  sleep 0.2
done
export APPLIANCE_API_TOKEN=$token
"$app" fleet enroll "$w/fleet.toml" --at "box=127.0.0.1:$https" > /dev/null

# The file, its signed manifest.
head -c "$((size_mib * 1024 * 1024))" /dev/urandom > "$w/model.gguf"
"$sup" weights manifest "$w/model.gguf" --id bench > "$w/model.toml"
"$app" model sign "$w/model.toml" --key "$w/fleet-key" > /dev/null
cat "$w/model.gguf" > /dev/null # into the page cache

# A private sshd on loopback taking this user's new key.
ssh_port=$(port)
ssh-keygen -q -t ed25519 -N '' -f "$w/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$w/user_key"
cp "$w/user_key.pub" "$w/authorized_keys"
chmod 600 "$w/authorized_keys"
mkdir -p /run/sshd
/usr/sbin/sshd -D -p "$ssh_port" -h "$w/host_key" -o ListenAddress=127.0.0.1 \
  -o AuthorizedKeysFile="$w/authorized_keys" -o PasswordAuthentication=no \
  -o StrictModes=no -o PidFile="$w/sshd.pid" &
pids+=($!)
sleep 1
mkdir -p "$w/scp-target"

now() { date +%s.%N; }
start=$(now)
"$app" fleet model push "$w/fleet.toml" --box box --at "box=127.0.0.1:$https" "$w/model.toml" "$w/model.gguf" > /dev/null 2> "$w/push.log"
push=$(echo "$(now) - $start" | bc -l)
scp_opts=(-q -P "$ssh_port" -i "$w/user_key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null)
start=$(now)
scp "${scp_opts[@]}" "$w/model.gguf" "$(id -un)@127.0.0.1:$w/scp-target/model.gguf"
scp_t=$(echo "$(now) - $start" | bc -l)
sync "$w/scp-target/model.gguf"
scp_sync=$(echo "$(now) - $start" | bc -l)

rate() { echo "$size_mib / $1" | bc -l; }
printf 'file: %s MiB over loopback, %s cores (%s)\n' "$size_mib" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf 'appliance fleet model push: %.2f s (%.0f MiB/s), installed and verified\n' "$push" "$(rate "$push")"
printf 'scp:                        %.2f s (%.0f MiB/s)\n' "$scp_t" "$(rate "$scp_t")"
printf 'scp, then sync:             %.2f s (%.0f MiB/s)\n' "$scp_sync" "$(rate "$scp_sync")"
printf 'ratio (push rate / scp rate): %.2fx; against scp then sync: %.2fx\n' \
  "$(echo "$scp_t / $push" | bc -l)" "$(echo "$scp_sync / $push" | bc -l)"
