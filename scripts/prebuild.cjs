#!/usr/bin/env node
'use strict';
/**
 * `npm run prebuilds [-- x64|arm64 ...]`: builds the addon and its spawner
 * (msbx-spawner) for linux-x64 and linux-arm64 (glibc) into prebuilds/, and records what they were built from
 * in prebuilds/manifest.json. The architecture Node runs on is built with the
 * machine's g++; the other with Debian's cross compiler
 * (`apt-get install g++-aarch64-linux-gnu`, or g++-x86-64-linux-gnu on arm64).
 * Node's headers are the same for both (N-API), so node-gyp needs only
 * `--arch` and the compiler.
 *
 * Each binary is checked before it is kept: its ELF machine, and the glibc
 * symbol versions it needs, none newer than Debian 12's glibc 2.36, which
 * builds them (a binary built on a newer distribution would not load on an
 * older one). The native one is also loaded.
 *
 * Builds are reproducible (same sources, compiler and headers give the same
 * bytes), which is how test/package/prebuilds.test.ts checks that the
 * committed binaries are what the sources compile to.
 */
const { spawnSync } = require('node:child_process');
const { createHash } = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { PREBUILT_ARCHS, prebuildFile, prebuildSpawnerFile } = require('../lib/native/addon.cjs');
const { nodeGypEnv, readManifest, sourcesDigest } = require('./install.cjs');

const ROOT = path.resolve(__dirname, '..');
/** Debian 12's glibc: no prebuild may need a newer symbol version. */
const MAX_GLIBC = '2.36';
const ELF_MACHINE = { x64: 'Advanced Micro Devices X86-64', arm64: 'AArch64' };
const CROSS_PREFIX = { x64: 'x86_64-linux-gnu-', arm64: 'aarch64-linux-gnu-' };
const CROSS_PACKAGE = { x64: 'g++-x86-64-linux-gnu', arm64: 'g++-aarch64-linux-gnu' };

function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, ...opts });
  if (r.error) throw new Error(`cannot run ${cmd}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (exit ${r.status}):\n${(r.stdout ?? '') + (r.stderr ?? '')}`.trim());
  return r.stdout ?? '';
}

/** The compilers for `arch`: the machine's own, or its cross compiler. */
function toolchain(arch) {
  const prefix = arch === process.arch ? '' : CROSS_PREFIX[arch];
  if (prefix === undefined) throw new Error(`no cross compiler known for ${arch} (prebuilt: ${PREBUILT_ARCHS.join(', ')})`);
  const cxx = `${prefix}g++`;
  const probe = spawnSync(cxx, ['--version'], { encoding: 'utf8' });
  if (probe.error || probe.status !== 0)
    throw new Error(`${cxx} is not installed${prefix ? `: apt-get install ${CROSS_PACKAGE[arch]}` : ''}`);
  return { cc: `${prefix}gcc`, cxx, compiler: probe.stdout.split('\n')[0].trim() };
}

/** The newest GLIBC_x.y symbol version `file` needs, from readelf. */
function maxGlibc(file) {
  const versions = [...run('readelf', ['-V', '--wide', file]).matchAll(/Name: GLIBC_([0-9.]+)/g)].map((m) => m[1]);
  return versions.sort(compareVersions).at(-1);
}

function compareVersions(a, b) {
  const x = a.split('.').map(Number);
  const y = b.split('.').map(Number);
  for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) - (y[i] ?? 0);
  return 0;
}

/**
 * Builds the addon for `arch` in a scratch copy of the sources (a
 * developer's build/ is left alone) and checks it. Returns the binary's path
 * (inside `scratch`, which the caller removes) and what the manifest records.
 */
function buildTarget(arch, scratch) {
  const tools = toolchain(arch);
  fs.cpSync(path.join(ROOT, 'binding.gyp'), path.join(scratch, 'binding.gyp'));
  fs.cpSync(path.join(ROOT, 'native'), path.join(scratch, 'native'), { recursive: true });
  // binding.gyp finds node-addon-api's headers with require() from here.
  fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(scratch, 'node_modules'));
  const nodeGyp = path.join(ROOT, 'node_modules', '.bin', 'node-gyp');
  run(nodeGyp, ['rebuild', `--arch=${arch}`], { cwd: scratch, env: nodeGypEnv({ CC: tools.cc, CXX: tools.cxx }) });
  const file = path.join(scratch, 'build', 'Release', 'minisandbox.node');
  const spawner = path.join(scratch, 'build', 'Release', 'msbx-spawner');
  const glibc = checkElf(arch, file);
  checkElf(arch, spawner);
  checkStatic(arch, spawner);
  if (arch === process.arch) {
    const addon = require(file);
    if (typeof addon.spawn !== 'function' || !(addon.syscalls?.openat > 0)) throw new Error(`the ${arch} build loads but lacks spawn or its syscall table`);
  }
  const data = fs.readFileSync(file);
  const spawnerData = fs.readFileSync(spawner);
  return {
    file,
    spawner,
    record: {
      sha256: createHash('sha256').update(data).digest('hex'),
      bytes: data.length,
      glibc,
      compiler: tools.compiler,
      // The spawner (native/spawner.cc), shipped beside the addon it serves.
      spawner: { sha256: createHash('sha256').update(spawnerData).digest('hex'), bytes: spawnerData.length, linkage: 'static' },
    },
  };
}

/**
 * Checks that the spawner is linked statically (binding.gyp says why): no
 * program interpreter, no dynamic section, so it loads no libc.so.6 at all.
 */
function checkStatic(arch, file) {
  const headers = run('readelf', ['-l', '-d', '--wide', file]);
  if (/Requesting program interpreter|NEEDED/.test(headers)) throw new Error(`the ${arch} build of ${path.basename(file)} is linked dynamically; binding.gyp links it statically`);
}

/** Checks a built binary's ELF machine and glibc needs; returns the newest GLIBC version it needs. */
function checkElf(arch, file) {
  const machine = /Machine:\s*(.*)/.exec(run('readelf', ['-h', file]))?.[1]?.trim();
  if (machine !== ELF_MACHINE[arch]) throw new Error(`the ${arch} build of ${path.basename(file)} is an ELF for ${machine}, not ${ELF_MACHINE[arch]}`);
  const glibc = maxGlibc(file);
  if (glibc && compareVersions(glibc, MAX_GLIBC) > 0) throw new Error(`the ${arch} build of ${path.basename(file)} needs GLIBC_${glibc}, newer than Debian 12's ${MAX_GLIBC}`);
  return glibc;
}

function main(args) {
  const archs = args.length > 0 ? args : PREBUILT_ARCHS;
  for (const a of archs) if (!PREBUILT_ARCHS.includes(a)) throw new Error(`unknown architecture '${a}' (prebuilt: ${PREBUILT_ARCHS.join(', ')})`);
  const sources = sourcesDigest(ROOT);
  const previous = readManifest(ROOT);
  const targets = previous?.sources === sources ? { ...previous.targets } : {};
  for (const arch of archs) {
    const scratch = fs.mkdtempSync(path.join(os.tmpdir(), `msbx-prebuild-${arch}-`));
    try {
      const { file, spawner, record } = buildTarget(arch, scratch);
      const target = `linux-${arch}-glibc`;
      fs.mkdirSync(path.dirname(prebuildFile(ROOT, target)), { recursive: true });
      fs.copyFileSync(file, prebuildFile(ROOT, target));
      fs.copyFileSync(spawner, prebuildSpawnerFile(ROOT, target));
      fs.chmodSync(prebuildSpawnerFile(ROOT, target), 0o755);
      targets[target] = record;
      process.stdout.write(`${target}: ${record.bytes} bytes, GLIBC_${record.glibc} at most, ${record.compiler}\n`);
    } finally {
      fs.rmSync(scratch, { recursive: true, force: true });
    }
  }
  const manifest = { sources, node: process.version, targets };
  fs.writeFileSync(path.join(ROOT, 'prebuilds', 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  const missing = PREBUILT_ARCHS.filter((a) => !targets[`linux-${a}-glibc`]);
  if (missing.length > 0) process.stdout.write(`not built for these sources yet: ${missing.join(', ')}\n`);
}

if (require.main === module) {
  try {
    main(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`prebuilds: ${err.message}\n`);
    process.exitCode = 1;
  }
}

module.exports = { buildTarget, checkStatic, maxGlibc, MAX_GLIBC, ELF_MACHINE };
