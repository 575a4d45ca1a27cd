#!/usr/bin/env bash
# scripts/arm64-node.sh DEST: Debian's arm64 Node (nodejs:arm64 and the
# libraries it links) unpacked into DEST, a sysroot for
#   qemu-aarch64-static -L DEST DEST/usr/bin/node ...
# so that test/package/prebuilds.test.ts can load the arm64 prebuild in a
# real arm64 Node on an x64 machine.
#
# apt runs with its own state under DEST/.apt: the machine's dpkg gets no
# foreign architecture and nothing is installed; only the package lists of
# the machine's own apt sources are read. DEST is laid out merged-/usr like
# the host (lib -> usr/lib): qemu's -L redirects every absolute path that
# exists in DEST, so a real DEST/lib directory would make readlink("/lib")
# fail inside the emulated Node where the host's is a symlink.
set -euo pipefail
dest=${1:?usage: scripts/arm64-node.sh DEST}
apt_dir="$dest/.apt"
rm -rf "$dest"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
apt_opts=(
  -o APT::Architecture=arm64 -o APT::Architectures::=arm64
  -o Dir::State="$apt_dir" -o Dir::State::Lists="$apt_dir/lists" -o Dir::State::status=/dev/null
  -o Dir::Cache="$apt_dir" -o Dir::Cache::archives="$apt_dir/archives"
  -o Debug::NoLocking=1 -o APT::Sandbox::User=root
)
apt-get "${apt_opts[@]}" update -qq
# nodejs and what it depends on, without the virtual '<...>' names apt lists.
mapfile -t pkgs < <(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances nodejs | grep -v '^ ' | grep -v '^<' | sort -u)
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download -qq "${pkgs[@]}")
for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dest"; done
for d in lib bin sbin; do
  if [ -d "$dest/$d" ] && [ ! -L "$dest/$d" ]; then
    mkdir -p "$dest/usr/$d"
    cp -a "$dest/$d/." "$dest/usr/$d/"
    rm -rf "${dest:?}/$d"
    ln -s "usr/$d" "$dest/$d"
  fi
done
rm -rf "$apt_dir"
chmod -R a+rX "$dest"
echo "arm64 Node in $dest: $(file -b "$dest/usr/bin/node" | cut -d, -f1-2)"
