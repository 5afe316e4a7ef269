#!/usr/bin/env bash
# The A/B update test end to end (as root, like the build): builds version 1 as an image with the
# default model, versions 2 and 3 as bundles (3 with an engine that cannot run), then boots
# version 1 under QEMU with the harness playing the Pi 5 firmware: a USB stick with version 2
# is installed, tried once through tryboot and committed; after a power cycle the box runs 2;
# a stick with version 3 is installed, fails its health check and the box is back on 2 by
# itself. About 15 minutes of builds with cached layers, then 20-30 minutes of QEMU (TCG).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${APPLIANCE_MODEL_CACHE:-target/tmp/model-cache}
cargo build --locked -p appliance-image
bin=target/debug/appliance-image
"$bin" build --with-model "$cache" --version 1
cp --sparse=always out/appliance-rpi5.img out/appliance-rpi5-v1.img
"$bin" build --version 2
"$bin" build --version 3 --test-broken-engine
exec "$bin" qemu-update-test --image out/appliance-rpi5-v1.img \
  --bundle out/appliance-rpi5-2.raucb --broken-bundle out/appliance-rpi5-3.raucb --versions 1 2 3
