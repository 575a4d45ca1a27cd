/**
 * The prebuilt addons in prebuilds/: current with native/, for the machine
 * they claim, no newer glibc than Debian 12's, reproducible from the sources,
 * and the arm64 one loaded by a real arm64 Node under qemu-user where that
 * is installed.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../helpers.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const require = createRequire(import.meta.url);

interface Manifest {
  sources: string;
  node: string;
  targets: Record<string, { sha256: string; bytes: number; glibc: string; compiler: string; spawner?: { sha256: string; bytes: number; linkage: 'static' } }>;
}
const addon = require(join(ROOT, 'lib/native/addon.cjs')) as {
  PREBUILT_ARCHS: string[];
  nodeLibc(executable?: string): string | undefined;
  prebuildTarget(libc?: string): { target?: string; reason?: string };
  prebuildFile(root: string, target: string): string;
  prebuildSpawnerFile(root: string, target: string): string;
  spawnerFile(root: string): { file?: string; reason?: string };
};
const install = require(join(ROOT, 'scripts/install.cjs')) as {
  prebuildProblems(root: string): string[];
  readManifest(root: string): Manifest;
  reasonToBuild(root: string, env: Record<string, string>): string | undefined;
};
const prebuild = require(join(ROOT, 'scripts/prebuild.cjs')) as {
  buildTarget(arch: string, scratch: string): { file: string; spawner: string; record: Manifest['targets'][string] };
  maxGlibc(file: string): string | undefined;
  MAX_GLIBC: string;
  ELF_MACHINE: Record<string, string>;
};

const manifest = install.readManifest(ROOT);
const fileOf = (arch: string) => addon.prebuildFile(ROOT, `linux-${arch}-glibc`);
const sha256 = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex');
const tool = (name: string) => spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' }).stdout.trim();

describe('prebuilt addons', () => {
  it('match native/ and binding.gyp as they are now (what npm pack checks first)', () => {
    expect(install.prebuildProblems(ROOT)).toEqual([]);
  });

  it('are refused once native/ changes: npm pack stops, and an install builds from source', () => {
    const copy = tempDir('msbx-stale-');
    try {
      for (const p of ['package.json', 'binding.gyp', 'native', 'prebuilds']) cpSync(join(ROOT, p), join(copy.path, p), { recursive: true });
      expect(install.prebuildProblems(copy.path)).toEqual([]);
      expect(install.reasonToBuild(copy.path, {})).toBeUndefined();
      writeFileSync(join(copy.path, 'native/addon.cc'), `${readFileSync(join(copy.path, 'native/addon.cc'), 'utf8')}\n// changed\n`);
      expect(install.prebuildProblems(copy.path)).toEqual([
        'prebuilds/manifest.json: built from other sources than native/ and binding.gyp hold now: run npm run prebuilds',
      ]);
      expect(install.reasonToBuild(copy.path, {})).toBe('the prebuilt addons were built from other sources than native/ holds now (npm run prebuilds makes them anew)');
      expect(install.reasonToBuild(copy.path, { MINISANDBOX_BUILD_FROM_SOURCE: '1' })).toBe('asked to build from source');
    } finally {
      copy.remove();
    }
  });

  it.each(addon.PREBUILT_ARCHS)('linux-%s is an ELF for that machine needing no glibc newer than Debian 12 has', (arch) => {
    const file = fileOf(arch);
    const header = spawnSync('readelf', ['-h', file], { encoding: 'utf8' });
    expect(header.status, header.stderr).toBe(0);
    expect(header.stdout).toMatch(new RegExp(`Machine:\\s*${prebuild.ELF_MACHINE[arch]}`));
    expect(header.stdout).toMatch(/Type:\s*DYN/);
    const glibc = prebuild.maxGlibc(file);
    expect(glibc).toBe(manifest.targets[`linux-${arch}-glibc`]!.glibc);
    const [major, minor] = glibc!.split('.').map(Number);
    expect(major! * 1000 + minor!).toBeLessThanOrEqual(2036);
  });

  it.each(addon.PREBUILT_ARCHS)('linux-%s has its spawner beside it: an executable for that machine, linked statically, as the manifest records', (arch) => {
    const file = addon.prebuildSpawnerFile(ROOT, `linux-${arch}-glibc`);
    expect(statSync(file).mode & 0o111, `${file} is executable`).not.toBe(0);
    const header = spawnSync('readelf', ['-h', '-l', '-d', '--wide', file], { encoding: 'utf8' });
    expect(header.status, header.stderr).toBe(0);
    expect(header.stdout).toMatch(new RegExp(`Machine:\\s*${prebuild.ELF_MACHINE[arch]}`));
    expect(header.stdout).toMatch(/Type:\s*EXEC/);
    // No interpreter and no shared library: it runs whatever libc the machine has.
    expect(header.stdout).not.toMatch(/Requesting program interpreter|NEEDED/);
    expect(prebuild.maxGlibc(file)).toBeUndefined();
    const want = manifest.targets[`linux-${arch}-glibc`]!.spawner!;
    expect(sha256(file)).toBe(want.sha256);
    expect(want.linkage).toBe('static');
  });

  it('a missing prebuilt spawner is named by npm pack\'s check and by the loader, which then clones in-process', () => {
    const copy = tempDir('msbx-nospawner-');
    try {
      for (const p of ['package.json', 'binding.gyp', 'native', 'prebuilds']) cpSync(join(ROOT, p), join(copy.path, p), { recursive: true });
      const target = `linux-${process.arch}-glibc`;
      rmSync(addon.prebuildSpawnerFile(copy.path, target));
      expect(install.prebuildProblems(copy.path)).toEqual([`prebuilds/${target}/msbx-spawner is missing: run npm run prebuilds`]);
      expect(install.reasonToBuild(copy.path, {})).toBe(`this package has no prebuilt ${target} spawner (msbx-spawner)`);
      expect(addon.spawnerFile(copy.path)).toEqual({
        file: addon.prebuildSpawnerFile(copy.path, target),
        reason: `${addon.prebuildSpawnerFile(copy.path, target)} does not exist`,
      });
      // A source build wins over the prebuild: its own spawner is the one taken.
      mkdirSync(join(copy.path, 'build', 'Release'), { recursive: true });
      writeFileSync(join(copy.path, 'build', 'Release', 'minisandbox.node'), '');
      expect(addon.spawnerFile(copy.path).file).toBe(join(copy.path, 'build', 'Release', 'msbx-spawner'));
    } finally {
      copy.remove();
    }
  });

  it('linux-x64 loads in this Node with the x86-64 syscall table', (ctx) => {
    if (process.arch !== 'x64') return ctx.skip(`this Node is ${process.arch}`);
    const native = require(fileOf('x64')) as { syscalls: Record<string, number>; spawn: unknown };
    expect(typeof native.spawn).toBe('function');
    expect(native.syscalls).toMatchObject({ openat: 257, open: 2, clone3: 435 });
  });

  // Same sources, compiler and headers give the same bytes: the committed
  // binaries are what the sources compile to, not an unreviewable blob.
  it.for(addon.PREBUILT_ARCHS)('linux-%s is rebuilt from the sources byte for byte', { timeout: 240_000 }, (arch, ctx) => {
    const want = manifest.targets[`linux-${arch}-glibc`]!;
    const cxx = arch === process.arch ? 'g++' : `${arch === 'arm64' ? 'aarch64' : 'x86_64'}-linux-gnu-g++`;
    if (!tool(cxx)) return ctx.skip(`${cxx} is not installed`);
    const compiler = spawnSync(cxx, ['--version'], { encoding: 'utf8' }).stdout.split('\n')[0]!.trim();
    if (compiler !== want.compiler) return ctx.skip(`the prebuild was made by ${want.compiler}, this machine has ${compiler}`);
    if (process.version !== manifest.node) return ctx.skip(`the prebuild was made with Node ${manifest.node}'s headers, this is ${process.version}`);
    const scratch = tempDir('msbx-rebuild-');
    try {
      const { file, spawner, record } = prebuild.buildTarget(arch, scratch.path);
      expect(record).toEqual(want);
      expect(sha256(file)).toBe(sha256(fileOf(arch)));
      expect(sha256(spawner)).toBe(sha256(addon.prebuildSpawnerFile(ROOT, `linux-${arch}-glibc`)));
    } finally {
      scratch.remove();
    }
  });

  it('are chosen for glibc only: on musl the loader and the install script say why not', () => {
    expect(addon.nodeLibc()).toBe('glibc');
    expect(addon.prebuildTarget('glibc')).toEqual({ target: `linux-${process.arch}-glibc` });
    expect(addon.prebuildTarget('musl')).toEqual({ reason: 'the prebuilt addons need glibc; Node here runs on musl' });
  });

  it('tell musl from glibc by the ELF interpreter of the executable', () => {
    const dir = tempDir('msbx-elf-');
    try {
      for (const [interp, libc] of [
        ['/lib/ld-musl-x86_64.so.1', 'musl'],
        ['/lib64/ld-linux-x86-64.so.2', 'glibc'],
        ['/lib/ld-linux-aarch64.so.1', 'glibc'],
      ] as const) {
        const exe = join(dir.path, 'exe');
        writeFileSync(exe, elfWithInterpreter(interp));
        expect(addon.nodeLibc(exe), interp).toBe(libc);
      }
      writeFileSync(join(dir.path, 'static'), elfWithInterpreter(undefined));
      expect(addon.nodeLibc(join(dir.path, 'static'))).toBeUndefined();
      writeFileSync(join(dir.path, 'script'), '#!/bin/sh\n');
      expect(addon.nodeLibc(join(dir.path, 'script'))).toBeUndefined();
      expect(addon.nodeLibc(join(dir.path, 'missing'))).toBeUndefined();
    } finally {
      dir.remove();
    }
  });
});

/** A minimal 64-bit little-endian ELF header with one program header: PT_INTERP naming `interp`, or PT_LOAD. */
function elfWithInterpreter(interp: string | undefined): Buffer {
  const name = Buffer.from(`${interp ?? ''}\0`, 'latin1');
  const buf = Buffer.alloc(64 + 56 + name.length);
  buf.writeUInt32BE(0x7f454c46, 0);
  buf[4] = 2; // 64-bit
  buf[5] = 1; // little-endian
  buf[6] = 1;
  buf.writeUInt16LE(3, 16); // ET_DYN
  buf.writeBigUInt64LE(64n, 32); // e_phoff
  buf.writeUInt16LE(56, 54); // e_phentsize
  buf.writeUInt16LE(1, 56); // e_phnum
  buf.writeUInt32LE(interp === undefined ? 1 : 3, 64); // PT_LOAD or PT_INTERP
  buf.writeBigUInt64LE(120n, 64 + 8); // p_offset
  buf.writeBigUInt64LE(BigInt(name.length), 64 + 32); // p_filesz
  name.copy(buf, 120);
  return buf;
}

// An arm64 machine emulated: Debian's arm64 Node (scripts/arm64-node.sh
// unpacks it; .ci/run does) run by qemu-user.
const ARM64_SYSROOT = process.env.MINISANDBOX_ARM64_SYSROOT ?? '/var/cache/minisandbox/arm64-node';

describe('the linux-arm64 prebuild under qemu-user', () => {
  const qemu = tool('qemu-aarch64-static') || tool('qemu-aarch64');
  const node = join(ARM64_SYSROOT, 'usr/bin/node');
  const skipWhy = !qemu ? 'qemu-user is not installed (apt-get install qemu-user-static)' : !existsSync(node) ? `no arm64 Node in ${ARM64_SYSROOT} (scripts/arm64-node.sh makes it)` : undefined;
  const arm64 = (args: string[], cwd = ROOT, env: NodeJS.ProcessEnv = process.env) =>
    spawnSync(qemu, ['-L', ARM64_SYSROOT, node, ...args], { cwd, encoding: 'utf8', timeout: 120_000, env });

  it('loads in an arm64 Node of another version, with the arm64 syscall table', (ctx) => {
    if (skipWhy) return ctx.skip(skipWhy);
    const r = arm64([
      '-e',
      `const a = require(${JSON.stringify(fileOf('arm64'))});
       console.log(JSON.stringify({ arch: process.arch, node: process.version, napi: process.versions.napi,
         openat: a.syscalls.openat, open: a.syscalls.open ?? null, clone3: a.syscalls.clone3, steps: a.stepNames.length, spawn: typeof a.spawn }));`,
    ]);
    expect(r.status, r.stderr).toBe(0);
    const got = JSON.parse(r.stdout) as Record<string, unknown>;
    // aarch64's generic table: openat is 56 and there is no open(2).
    expect(got).toMatchObject({ arch: 'arm64', openat: 56, open: null, clone3: 435, spawn: 'function' });
    expect(got.node).not.toBe(process.version);
    expect(Number(got.napi)).toBeGreaterThanOrEqual(8);
    const x64 = require(join(ROOT, 'lib/native/addon.cjs')) as { loadAddon(root: string): { stepNames: string[] } };
    expect(got.steps).toBe(x64.loadAddon(ROOT).stepNames.length);
  });

  it('runs the library up to the kernel: doctor explains that qemu-user cannot make namespaces', (ctx) => {
    if (skipWhy) return ctx.skip(skipWhy);
    // The package as installed (no build/, so the loader takes the prebuild).
    const pkg = tempDir('msbx-arm64-pkg-');
    try {
      for (const p of ['package.json', 'binding.gyp', 'dist/lib', 'lib/native/addon.cjs', 'prebuilds']) {
        mkdirSync(join(pkg.path, p, '..'), { recursive: true });
        cpSync(join(ROOT, p), join(pkg.path, p), { recursive: true });
      }
      symlinkSync(join(ROOT, 'node_modules'), join(pkg.path, 'node_modules'));
      // qemu-user runs one foreign process; the arm64 spawner it would exec
      // (without binfmt_misc) does not start, and doctor says so...
      const viaSpawner = arm64([join(pkg.path, 'dist/lib/cli/main.js'), 'doctor', '--json'], pkg.path);
      const spawnPath = (JSON.parse(viaSpawner.stdout) as { name: string; detail: string }[]).find((c) => c.name === 'spawn path');
      expect(spawnPath?.detail).toContain(join(pkg.path, 'prebuilds', 'linux-arm64-glibc', 'msbx-spawner'));
      // ... so the library is taken to the kernel on the in-process path.
      const r = arm64([join(pkg.path, 'dist/lib/cli/main.js'), 'doctor', '--json'], pkg.path, { ...process.env, MINISANDBOX_SPAWNER: 'inprocess' });
      const checks = JSON.parse(r.stdout) as { name: string; ok: boolean; detail: string }[];
      expect(checks.find((c) => c.name === 'kernel')?.ok).toBe(true);
      // qemu-user implements neither clone3 nor namespaces: the spawn fails
      // in the kernel call, with the errno named, not in loading or in JS.
      const ns = checks.find((c) => c.name.startsWith('user+mount+pid'));
      expect(ns?.ok).toBe(false);
      expect(ns?.detail).toMatch(/ENOSYS/);
      expect(r.status).toBe(1);
    } finally {
      pkg.remove();
    }
  }, 120_000);
});
