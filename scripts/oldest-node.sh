#!/usr/bin/env bash
# scripts/oldest-node.sh DEST: the oldest Node that package.json's engines
# allows, from the npm registry's node-linux-<arch> package (Node's own
# release binary), unpacked as DEST/bin/node, for test/package/pack.test.ts
# to run the installed package on it.
set -euo pipefail
dest=${1:?usage: scripts/oldest-node.sh DEST}
cd "$(dirname "$0")/.."
min=$(node -p "require('./package.json').engines.node.replace(/^>=\s*/, '')")
arch=$(node -p process.arch)
rm -rf "$dest"
mkdir -p "$dest"
tgz=$(cd "$dest" && npm pack --silent "node-linux-$arch@$min")
tar -C "$dest" -xzf "$dest/$tgz" --strip-components=1
rm "$dest/$tgz"
chmod -R a+rX "$dest"
echo "oldest Node that engines allows ($min): $("$dest/bin/node" --version) in $dest"
