'use strict';
/**
 * Where the native addon comes from, in one place for the two that load it:
 * lib/native/index.ts at run time, and scripts/install.cjs at `npm install`,
 * which runs before TypeScript is compiled in a git checkout (hence plain
 * CommonJS, shipped as it is).
 *
 * `bindings` looks in two places, in this order:
 *  1. build/Release/minisandbox.node: a source build (node-gyp, the install
 *     fallback or a developer's `npx node-gyp build`), which must win over
 *     the prebuilt binary it was made to replace;
 *  2. prebuilds/linux-<arch>-glibc/minisandbox.node: the binaries shipped in
 *     the package (scripts/prebuild.cjs), when Node itself runs on glibc.
 * The spawner binary (msbx-spawner) is taken from the same place as the
 * addon (spawnerFile).
 * The addon is N-API (NAPI_VERSION 8), so one binary serves every Node
 * version; there is no per-ABI directory.
 */
const fs = require('node:fs');
const path = require('node:path');
const bindings = require('bindings');

const ADDON = 'minisandbox';
/** The spawner's binary (native/spawner.cc), built and shipped beside the addon. */
const SPAWNER = 'msbx-spawner';
/** The architectures prebuilt in the package (scripts/prebuild.cjs builds each). */
const PREBUILT_ARCHS = ['x64', 'arm64'];
const PT_INTERP = 3;

/**
 * The C library the running Node is linked against: 'glibc', 'musl', or
 * undefined (not Linux, statically linked, unreadable). Read from the ELF
 * interpreter of Node's executable (ld-linux-*.so for glibc, ld-musl-*.so for
 * musl): process.report says the same through glibcVersionRuntime, but a
 * report costs ~4 ms, on every start of the CLI.
 */
function nodeLibc(executable = process.execPath) {
  if (process.platform !== 'linux') return undefined;
  let fd;
  try {
    fd = fs.openSync(executable, 'r');
    const read = (length, position) => {
      const buf = Buffer.alloc(length);
      return buf.subarray(0, fs.readSync(fd, buf, 0, length, position));
    };
    const ehdr = read(64, 0);
    // ELF, 64-bit, little-endian: what Node is on x64 and arm64 Linux.
    if (ehdr.length < 64 || ehdr.readUInt32BE(0) !== 0x7f454c46 || ehdr[4] !== 2 || ehdr[5] !== 1) return undefined;
    const phoff = Number(ehdr.readBigUInt64LE(32));
    const phentsize = ehdr.readUInt16LE(54);
    const phnum = ehdr.readUInt16LE(56);
    const phdrs = read(phentsize * phnum, phoff);
    for (let off = 0; off + 56 <= phdrs.length; off += phentsize) {
      if (phdrs.readUInt32LE(off) !== PT_INTERP) continue;
      const interp = read(Math.min(Number(phdrs.readBigUInt64LE(off + 32)), 4096), Number(phdrs.readBigUInt64LE(off + 8)));
      const name = path.basename(interp.toString('latin1').replace(/\0.*$/s, ''));
      if (name.startsWith('ld-musl-')) return 'musl';
      if (name.startsWith('ld-linux')) return 'glibc';
      return undefined;
    }
    return undefined;
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

/**
 * The prebuilt target for this process ('linux-x64-glibc'), or why there is
 * none. The prebuilds are linked against glibc (no symbol version newer than
 * Debian 12's 2.36; prebuilds/manifest.json records each one's newest), so
 * musl (Alpine) and other architectures build from source.
 */
function prebuildTarget(libc = nodeLibc()) {
  const host = `${process.platform}-${process.arch}${libc ? ` (${libc})` : ''}`;
  if (process.platform !== 'linux' || !PREBUILT_ARCHS.includes(process.arch)) return { reason: `no prebuilt addon for ${host}` };
  if (libc !== 'glibc') return { reason: `the prebuilt addons need glibc; Node here runs on ${libc ?? 'an unknown C library'}` };
  return { target: `linux-${process.arch}-glibc` };
}

/** Where a prebuilt addon lives in the package. */
function prebuildFile(root, target) {
  return path.join(root, 'prebuilds', target, `${ADDON}.node`);
}

/** Where the prebuilt spawner lives in the package, beside its addon. */
function prebuildSpawnerFile(root, target) {
  return path.join(root, 'prebuilds', target, SPAWNER);
}

/**
 * The spawner that belongs to the addon loadAddon(root) loads, by the same
 * order: a source build's (build/Release) if there is a source build, else
 * the prebuilt one. Never one from the other place: the two speak the
 * protocol of their own build. { file } if it is there and executable, else
 * { file, reason } (file: where it was looked for, or undefined).
 */
function spawnerFile(root) {
  const built = path.join(root, 'build', 'Release');
  let dir;
  if (fs.existsSync(path.join(built, `${ADDON}.node`))) dir = built;
  else {
    const { target, reason } = prebuildTarget();
    if (!target) return { reason };
    dir = path.dirname(prebuildSpawnerFile(root, target));
  }
  const file = path.join(dir, SPAWNER);
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return { file };
  } catch (err) {
    return { file, reason: `${file} ${err.code === 'ENOENT' ? 'does not exist' : `is not executable (${err.code})`}` };
  }
}

/**
 * Loads the addon of the package at `root`: a source build if there is one,
 * else the prebuilt binary for this platform. Throws an Error saying what
 * was tried and how to build from source.
 */
function loadAddon(root) {
  const tries = [['module_root', 'build', 'Release', 'bindings']];
  const { target, reason } = prebuildTarget();
  if (target) tries.push(['module_root', 'prebuilds', target, 'bindings']);
  try {
    return bindings({ bindings: ADDON, module_root: root, try: tries });
  } catch (err) {
    const why = /Could not locate the bindings file/.test(err.message)
      ? `no source build in ${path.join(root, 'build', 'Release')}${target ? ` and no ${prebuildFile(root, target)}` : `, and ${reason}`}`
      : err.message;
    throw new Error(
      `minisandbox: cannot load the native addon: ${why}. ` +
        `Build it from source with 'MINISANDBOX_BUILD_FROM_SOURCE=1 npm rebuild minisandbox' (needs python3, make and a C++20 compiler)`,
      { cause: err },
    );
  }
}

module.exports = { ADDON, SPAWNER, PREBUILT_ARCHS, nodeLibc, prebuildTarget, prebuildFile, prebuildSpawnerFile, spawnerFile, loadAddon };
