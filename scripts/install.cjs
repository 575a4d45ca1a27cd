#!/usr/bin/env node
'use strict';
/**
 * `npm install` of minisandbox: use the prebuilt addon when it is current and
 * loads here, else build from source with node-gyp (npm puts its own node-gyp
 * on PATH for install scripts; a git checkout has the devDependency).
 *
 *   node scripts/install.cjs                    what npm runs
 *   node scripts/install.cjs --check-prebuilds  before `npm pack`: fail unless
 *                                               every prebuild matches native/
 *
 * Building from source is forced by `--build-from-source` (npm config, the
 * convention of prebuilt-addon installers) or MINISANDBOX_BUILD_FROM_SOURCE=1.
 */
const { spawnSync } = require('node:child_process');
const { createHash } = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { PREBUILT_ARCHS, loadAddon, prebuildFile, prebuildSpawnerFile, prebuildTarget } = require('../lib/native/addon.cjs');

const ROOT = path.resolve(__dirname, '..');
const MANIFEST = path.join('prebuilds', 'manifest.json');

/**
 * sha256 of what a build of the addon is made from: binding.gyp, every file
 * under native/, and the node-addon-api version package.json asks for. A
 * prebuild records it (prebuilds/manifest.json); a checkout whose native code
 * changed since no longer matches, and builds from source instead of loading
 * a binary of other sources.
 */
function sourcesDigest(root = ROOT) {
  const files = ['binding.gyp'];
  const walk = (rel) => {
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const r = path.posix.join(rel, e.name);
      if (e.isDirectory()) walk(r);
      else files.push(r);
    }
  };
  walk('native');
  const h = createHash('sha256');
  for (const f of files.sort()) {
    const data = fs.readFileSync(path.join(root, f));
    h.update(`${f}\0${data.length}\0`).update(data);
  }
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  h.update(`node-addon-api\0${pkg.dependencies?.['node-addon-api'] ?? ''}`);
  return h.digest('hex');
}

/** prebuilds/manifest.json, or undefined if the package has none. */
function readManifest(root = ROOT) {
  try {
    return JSON.parse(fs.readFileSync(path.join(root, MANIFEST), 'utf8'));
  } catch (err) {
    if (err.code === 'ENOENT') return undefined;
    throw new Error(`${MANIFEST}: ${err.message}`);
  }
}

/** Why the prebuilt addon cannot serve here (a sentence), or undefined if it can. */
function reasonToBuild(root = ROOT, env = process.env) {
  if (/^(1|true)$/.test(env.MINISANDBOX_BUILD_FROM_SOURCE ?? '') || env.npm_config_build_from_source === 'true') return 'asked to build from source';
  const { target, reason } = prebuildTarget();
  if (!target) return reason;
  const manifest = readManifest(root);
  if (!manifest?.targets?.[target] || !fs.existsSync(prebuildFile(root, target))) return `this package has no prebuilt ${target} addon`;
  if (!fs.existsSync(prebuildSpawnerFile(root, target))) return `this package has no prebuilt ${target} spawner (msbx-spawner)`;
  if (manifest.sources !== sourcesDigest(root)) return `the prebuilt addons were built from other sources than native/ holds now (npm run prebuilds makes them anew)`;
  try {
    require(prebuildFile(root, target));
  } catch (err) {
    return `the prebuilt ${target} addon does not load here: ${err.message.split('\n')[0]}`;
  }
  // The spawner is a program of its own: it needs its own check (linked
  // statically, it needs no glibc, but it must run on this machine).
  const spawner = prebuildSpawnerFile(root, target);
  const r = spawnSync(spawner, ['--version'], { encoding: 'utf8' });
  if (r.error?.code === 'EACCES') fs.chmodSync(spawner, 0o755);
  const again = r.error?.code === 'EACCES' ? spawnSync(spawner, ['--version'], { encoding: 'utf8' }) : r;
  if (again.status !== 0) {
    const why = again.error ? again.error.message : (again.stderr || `exit ${again.status ?? again.signal}`).trim().split('\n')[0];
    return `the prebuilt ${target} spawner does not run here: ${why}`;
  }
  return undefined;
}

/**
 * The environment node-gyp runs in: where npm config names no nodedir, the
 * headers installed with this Node (a distribution's nodejs, a tarball
 * install), which node-gyp would otherwise download.
 */
function nodeGypEnv(extra = {}) {
  const env = { ...process.env, ...extra };
  const nodedir = path.dirname(path.dirname(process.execPath));
  if (!env.npm_config_nodedir && fs.existsSync(path.join(nodedir, 'include', 'node', 'node_api.h'))) env.npm_config_nodedir = nodedir;
  return env;
}

/** The problems that make the prebuilds unfit to publish ([] when fit). */
function prebuildProblems(root = ROOT) {
  const manifest = readManifest(root);
  if (!manifest) return [`${MANIFEST} is missing: run npm run prebuilds`];
  const problems = [];
  if (manifest.sources !== sourcesDigest(root)) problems.push(`${MANIFEST}: built from other sources than native/ and binding.gyp hold now: run npm run prebuilds`);
  for (const arch of PREBUILT_ARCHS) {
    const target = `linux-${arch}-glibc`;
    const file = prebuildFile(root, target);
    const want = manifest.targets?.[target]?.sha256;
    if (!fs.existsSync(file)) problems.push(`${path.relative(root, file)} is missing: run npm run prebuilds`);
    else if (createHash('sha256').update(fs.readFileSync(file)).digest('hex') !== want)
      problems.push(`${path.relative(root, file)} is not the binary ${MANIFEST} records: run npm run prebuilds`);
    const spawner = prebuildSpawnerFile(root, target);
    const wantSpawner = manifest.targets?.[target]?.spawner?.sha256;
    if (!fs.existsSync(spawner)) problems.push(`${path.relative(root, spawner)} is missing: run npm run prebuilds`);
    else if (createHash('sha256').update(fs.readFileSync(spawner)).digest('hex') !== wantSpawner)
      problems.push(`${path.relative(root, spawner)} is not the binary ${MANIFEST} records: run npm run prebuilds`);
    else if ((fs.statSync(spawner).mode & 0o111) === 0) problems.push(`${path.relative(root, spawner)} is not executable: chmod 755 it`);
  }
  return problems;
}

function main(args) {
  if (args.includes('--check-prebuilds')) {
    const problems = prebuildProblems();
    for (const p of problems) process.stderr.write(`minisandbox: ${p}\n`);
    return problems.length === 0 ? 0 : 1;
  }
  const why = reasonToBuild();
  if (why === undefined) {
    // A build/ left by an earlier source build would shadow the prebuild
    // (source builds load first); `node-gyp rebuild`, the install step this
    // replaces, cleaned it too.
    fs.rmSync(path.join(ROOT, 'build'), { recursive: true, force: true });
    process.stdout.write(`minisandbox: using the prebuilt addon ${prebuildTarget().target}\n`);
    return 0;
  }
  process.stdout.write(`minisandbox: building the addon from source (${why})\n`);
  const r = spawnSync('node-gyp', ['rebuild'], { cwd: ROOT, stdio: 'inherit', env: nodeGypEnv() });
  if (r.error) {
    process.stderr.write(`minisandbox: cannot run node-gyp: ${r.error.message} (npm provides it to install scripts; or install node-gyp)\n`);
    return 1;
  }
  if (r.status !== 0) return r.status ?? 1;
  loadAddon(ROOT);
  return 0;
}

if (require.main === module) {
  try {
    process.exitCode = main(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`minisandbox: ${err.message}\n`);
    process.exitCode = 1;
  }
}

module.exports = { sourcesDigest, readManifest, reasonToBuild, prebuildProblems, nodeGypEnv };
