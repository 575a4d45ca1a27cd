/**
 * The published package as a user gets it: `npm pack`, then an install of
 * the tarball into an empty folder, with no compiler on PATH, then the
 * installed `minisandbox doctor`.
 */
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, posix, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tempDir } from '../helpers.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const work = tempDir('msbx-pack-');
let tarball = '';
let files: string[] = [];
/** The project of the compiler-free install, once that test has made it. */
let installedApp: string | undefined;
/** The oldest Node that engines allows (scripts/oldest-node.sh; .ci/run fetches it). */
const OLDEST_NODE = process.env.MINISANDBOX_OLDEST_NODE ?? '/var/cache/minisandbox/node-oldest/bin/node';

/** A PATH with node, npm and npx and a shell, and nothing else: no gcc, g++, cc, c++, make. */
function bareBin(): string {
  const bin = join(work.path, 'bin');
  mkdirSync(bin, { recursive: true });
  const nodeDir = dirname(process.execPath);
  for (const tool of ['node', 'npm', 'npx']) {
    const at = existsSync(join(nodeDir, tool)) ? join(nodeDir, tool) : which(tool);
    symlinkSync(at, join(bin, tool));
  }
  symlinkSync(which('sh'), join(bin, 'sh'));
  return bin;
}

function which(tool: string): string {
  const r = spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${tool} is not on PATH`);
  return r.stdout.trim();
}

/** What a user's shell would have, with PATH and extra variables as given. */
function userEnv(path: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { HOME: process.env.HOME ?? '/', PATH: path, LANG: 'C.UTF-8', ...extra };
}

function run(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): SpawnSyncReturns<string> {
  return spawnSync(cmd, args, { cwd, env, encoding: 'utf8', timeout: 240_000 });
}

/** An empty project that installs the tarball; `allowScripts` lets npm >= 11.? run its install script. */
function install(name: string, env: NodeJS.ProcessEnv, opts: { allowScripts: boolean }): { dir: string; r: SpawnSyncReturns<string> } {
  const dir = join(work.path, name);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: `app-${name}`, private: true, ...(opts.allowScripts ? { allowScripts: { minisandbox: true } } : {}) }));
  // Dependencies come from npm's cache where it has them (root's, after the
  // project's own npm ci), else from the registry.
  const r = run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--foreground-scripts', tarball], dir, env);
  return { dir, r };
}

/** Which file the installed package's loader loads, relative to the package. */
function loadedFrom(pkg: string, env: NodeJS.ProcessEnv): string {
  const loader = JSON.stringify(join(pkg, 'lib', 'native', 'addon.cjs'));
  const r = run(process.execPath, ['-e', `console.log(require(${loader}).loadAddon(${JSON.stringify(pkg)}).path)`], pkg, env);
  if (r.status !== 0) throw new Error(`loading the addon of ${pkg}: ${r.stderr}`);
  return relative(pkg, r.stdout.trim());
}

const NETWORK = /E(AI_AGAIN|NOTFOUND|NOTCACHED|CONNREFUSED|CONNRESET|TIMEDOUT|NETUNREACH)/;

beforeAll(() => {
  // Scripts off: dist is built by the test run's pretest, and prepare (tsc)
  // would rewrite it under the other test files; the prepack check has its
  // own test (prebuilds.test.ts).
  const r = spawnSync('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work.path], { cwd: ROOT, encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`npm pack failed: ${r.stderr}`);
  const [info] = JSON.parse(r.stdout) as { filename: string; files: { path: string }[] }[];
  tarball = join(work.path, info!.filename);
  files = info!.files.map((f) => f.path);
}, 180_000);

afterAll(() => work.remove());

describe('the packed tarball', () => {
  it('holds the library, its prebuilt addons, the sources of its source maps and a LICENSE, not benchmarks or tests', () => {
    for (const f of [
      'LICENSE',
      'README.md',
      'package.json',
      'dist/lib/index.js',
      'dist/lib/index.d.ts',
      'dist/lib/cli/main.js',
      'lib/native/addon.cjs',
      'scripts/install.cjs',
      'binding.gyp',
      'native/addon.cc',
      'prebuilds/manifest.json',
      'prebuilds/linux-x64-glibc/minisandbox.node',
      'prebuilds/linux-arm64-glibc/minisandbox.node',
      'prebuilds/linux-x64-glibc/msbx-spawner',
      'prebuilds/linux-arm64-glibc/msbx-spawner',
      'native/spawner.cc',
    ])
      expect(files).toContain(f);
    const unwanted = files.filter((f) => /^(benchmarks|dist\/benchmarks|test|build|node_modules|sbench)\b|\.test\.|^scripts\/(?!install\.cjs$)/.test(f));
    expect(unwanted).toEqual([]);
    // Every source a shipped source map names is shipped too.
    const maps = files.filter((f) => f.endsWith('.map'));
    expect(maps.length).toBeGreaterThan(50);
    const missing: string[] = [];
    for (const map of maps) {
      const { sources } = JSON.parse(readFileSync(join(ROOT, map), 'utf8')) as { sources: string[] };
      for (const s of sources) {
        const shipped = posix.normalize(posix.join(posix.dirname(map), s));
        if (!files.includes(shipped)) missing.push(`${map} -> ${shipped}`);
      }
    }
    expect(missing).toEqual([]);
  });

  it('installs into an empty folder with no compiler on PATH and runs minisandbox doctor', (ctx) => {
    const bin = bareBin();
    const env = userEnv(bin);
    expect(run('sh', ['-c', 'command -v gcc g++ cc c++ make || true'], work.path, env).stdout).toBe('');

    // As npm >= 11 installs by default: dependencies' install scripts withheld.
    // The prebuilt addon is found at run time all the same.
    const plain = install('plain', env, { allowScripts: false });
    if (plain.r.status !== 0 && NETWORK.test(plain.r.stderr)) return ctx.skip(`the npm registry is unreachable and the cache lacks a dependency: ${plain.r.stderr.trim().split('\n').at(-1)}`);
    expect(plain.r.status, plain.r.stderr).toBe(0);

    // With the install script allowed: it picks the prebuild and compiles nothing.
    const allowed = install('allowed', env, { allowScripts: true });
    expect(allowed.r.status, allowed.r.stderr).toBe(0);
    expect(allowed.r.stdout).toContain(`minisandbox: using the prebuilt addon linux-${process.arch}-glibc`);

    for (const { dir } of [plain, allowed]) {
      const pkg = join(dir, 'node_modules', 'minisandbox');
      expect(existsSync(join(pkg, 'build')), 'no source build').toBe(false);
      expect(loadedFrom(pkg, env)).toBe(join('prebuilds', `linux-${process.arch}-glibc`, 'minisandbox.node'));
      // The runtime dependencies: no node-gyp and its 50 packages. bindings,
      // node-addon-api and tar, plus the cluster's queue client (bullmq,
      // ioredis) and their 25 or so, none of which compiles anything.
      const installed = readdirSync(join(dir, 'node_modules')).filter((n) => !n.startsWith('.'));
      expect(installed).not.toContain('node-gyp');
      expect(installed.sort()).toEqual(expect.arrayContaining(['bindings', 'bullmq', 'ioredis', 'minisandbox', 'node-addon-api', 'tar']));
      expect(installed.length).toBeLessThan(36);

      const doctor = run('npx', ['--no-install', 'minisandbox', 'doctor'], dir, env);
      expect(doctor.status, doctor.stdout + doctor.stderr).toBe(0);
      expect(doctor.stdout).toMatch(/^ok {4}user\+mount\+pid\+ipc\+uts\+net namespaces/m);
      // Spawns go through the prebuilt spawner, executable as unpacked (even
      // with the install script withheld, which would chmod it).
      const spawner = join(pkg, 'prebuilds', `linux-${process.arch}-glibc`, 'msbx-spawner');
      expect(statSync(spawner).mode & 0o111).not.toBe(0);
      expect(doctor.stdout).toContain(`spawner ${spawner}, running as pid`);
    }
    installedApp = plain.dir;
  }, 300_000);

  it("runs on the oldest Node that engines allows: doctor, and the README's API in its portable form", (ctx) => {
    if (!installedApp) return ctx.skip('the package was not installed');
    if (!existsSync(OLDEST_NODE)) return ctx.skip(`no ${OLDEST_NODE} (scripts/oldest-node.sh fetches it)`);
    const version = run(OLDEST_NODE, ['--version'], work.path, process.env).stdout.trim();
    const min = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } }).engines.node.replace(/^>=\s*/, '');
    expect(version.startsWith(`v${min}.`), `${OLDEST_NODE} is ${version}, engines asks for >=${min}`).toBe(true);
    const env = userEnv(`${dirname(OLDEST_NODE)}:/usr/bin:/bin`);
    const doctor = run(OLDEST_NODE, [join(installedApp, 'node_modules/minisandbox/dist/lib/cli/main.js'), 'doctor'], installedApp, env);
    expect(doctor.status, doctor.stdout + doctor.stderr).toBe(0);
    const src = join(work.path, 'upload-src');
    mkdirSync(src);
    writeFileSync(join(src, 'data.txt'), 'uploaded');
    const script = join(installedApp, 'example.mjs');
    writeFileSync(
      script,
      `import { Sandbox, run } from 'minisandbox';
const r = await run({ argv: ['sh', '-c', 'echo $((2 + 2))'], timeout: 10_000 });
const sb = await Sandbox.create({ limits: { pids: 64 } });
try {
  const sh = await sb.shell({ name: 'main' });
  await sh.run('export X=kept');
  const { output } = await sh.run('echo $X');
  await sb.upload(${JSON.stringify(src)}, '/work/up');
  const up = await sb.readFile('/work/up/data.txt', 'utf8');
  console.log(JSON.stringify({ node: process.version, run: r.stdout, shell: output.trim(), up }));
} finally {
  await sb.close();
}
`,
    );
    const r = run(OLDEST_NODE, [script], installedApp, env);
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ node: version, run: '4\n', shell: 'kept', up: 'uploaded' });
  }, 120_000);

  it('falls back to a node-gyp source build where asked (MINISANDBOX_BUILD_FROM_SOURCE=1)', (ctx) => {
    // The install script points node-gyp at the headers installed with this
    // Node; it cannot download them here.
    const missing = ['g++', 'make', 'python3'].find((t) => run('sh', ['-c', `command -v ${t}`], work.path, process.env).status !== 0);
    if (missing) return ctx.skip(`${missing} is not installed: no source build here`);
    const nodedir = dirname(dirname(process.execPath));
    if (!existsSync(join(nodedir, 'include', 'node', 'node_api.h'))) return ctx.skip(`no Node headers in ${nodedir}/include/node for node-gyp`);
    const env = userEnv(process.env.PATH ?? '/usr/bin:/bin', { MINISANDBOX_BUILD_FROM_SOURCE: '1' });
    const built = install('source', env, { allowScripts: true });
    if (built.r.status !== 0 && NETWORK.test(built.r.stderr)) return ctx.skip('the npm registry is unreachable and the cache lacks a dependency');
    expect(built.r.status, built.r.stdout + built.r.stderr).toBe(0);
    expect(built.r.stdout).toContain('minisandbox: building the addon from source (asked to build from source)');
    const pkg = join(built.dir, 'node_modules', 'minisandbox');
    expect(existsSync(join(pkg, 'build', 'Release', 'minisandbox.node'))).toBe(true);
    // The source build is what loads, not the prebuild beside it.
    expect(loadedFrom(pkg, env)).toBe(join('build', 'Release', 'minisandbox.node'));
    const doctor = run('npx', ['--no-install', 'minisandbox', 'doctor'], built.dir, env);
    expect(doctor.status, doctor.stdout + doctor.stderr).toBe(0);
    // And the spawner of that build, not the prebuilt one (another protocol, maybe).
    expect(doctor.stdout).toContain(`spawner ${join(pkg, 'build', 'Release', 'msbx-spawner')}, running as pid`);
  }, 300_000);
});
