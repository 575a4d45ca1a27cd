#!/usr/bin/env node
// node benchmarks/tar.mjs [ROUNDS]: GNU tar against node-tar where this
// package moves archives (docs/packaging.md has the figures). Needs a build
// (npm run build). Rounds alternate the two sides; medians are printed.
//
//  tree: 5,000 files of 20 KiB (100 MB)
//    pack      tar -c of the tree, read to the end by Node
//    upload    the tree packed on the host, unpacked by tar -x in a sandbox's /tmp
//    unpack    tar -x on the host into /dev/shm (the host side of a download)
//  file: one 256 MiB file uploaded: node-tar's one-member stream (upload
//        today) against reading it whole and writing it (upload before)
import { spawn } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { closeSync, createReadStream, createWriteStream, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { create as createTar, extract as extractTar } from 'tar';
import { Sandbox } from '../dist/lib/index.js';

const rounds = Number(process.argv[2] ?? 5);
const work = mkdtempSync(join(tmpdir(), 'msbx-bench-tar-'));
const tree = join(work, 'tree');
for (let d = 0; d < 50; d++) {
  mkdirSync(join(tree, `d${d}`), { recursive: true });
  for (let f = 0; f < 100; f++) writeFileSync(join(tree, `d${d}`, `f${f}.py`), randomFillSync(Buffer.alloc(20 << 10)));
}
await pipeline(gnuPack(), createWriteStream(join(work, 'tree.tar')));
// Written 1 MiB at a time: the process's maximum RSS must stay its own.
const big = join(work, 'big.bin');
const fd = openSync(big, 'w');
for (let i = 0; i < 256; i++) writeSync(fd, randomFillSync(Buffer.alloc(1 << 20)));
closeSync(fd);

function gnuPack() {
  return spawn('tar', ['-C', tree, '-cf', '-', '.'], { stdio: ['ignore', 'pipe', 'inherit'] }).stdout;
}
const nodePack = () => createTar({ cwd: tree, portable: true }, ['.']);
async function drain(stream) {
  let bytes = 0;
  for await (const c of stream) bytes += c.length;
  return bytes;
}
function exited(child) {
  return new Promise((resolve, reject) => child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`exit ${code}`)))));
}

const sb = await Sandbox.create();
let n = 0;
/** A tar stream into tar -x in the sandbox's /tmp, as Sandbox.upload does. */
async function intoSandbox(stream) {
  const dir = `/tmp/u${n++}`;
  const proc = sb.spawn(['/bin/sh', '-c', 'mkdir -p "$1" && exec tar -C "$1" --no-same-owner -xf -', 'sh', dir], { stdin: 'pipe' });
  stream.pipe(proc.stdin);
  const info = await proc.exited;
  if (info.exitCode !== 0) throw new Error(`tar -x in the sandbox: exit ${info.exitCode}`);
  await sb.exec(['rm', '-rf', dir]);
}
async function unpackHost(useNode) {
  const dest = mkdtempSync('/dev/shm/msbx-bench-');
  try {
    if (useNode) {
      const x = extractTar({ cwd: dest });
      createReadStream(join(work, 'tree.tar')).pipe(x);
      await new Promise((resolve, reject) => x.on('close', resolve).on('error', reject));
    } else {
      const t = spawn('tar', ['-C', dest, '-xf', '-'], { stdio: ['pipe', 'ignore', 'inherit'] });
      createReadStream(join(work, 'tree.tar')).pipe(t.stdin);
      await exited(t);
    }
  } finally {
    rmSync(dest, { recursive: true, force: true });
  }
}

const cases = {
  'tree pack': [() => drain(gnuPack()), () => drain(nodePack())],
  'tree upload': [() => sb.upload(tree, `/tmp/u${n++}`).then(() => sb.exec('rm -rf /tmp/u*')), () => intoSandbox(nodePack())],
  'tree unpack': [() => unpackHost(false), () => unpackHost(true)],
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const timed = async (f) => {
  const t = performance.now();
  await f();
  return performance.now() - t;
};
console.log(`${rounds} rounds; medians in ms`);
for (const [name, [gnu, node]] of Object.entries(cases)) {
  const g = [];
  const t = [];
  for (let i = 0; i < rounds; i++) {
    g.push(await timed(gnu));
    t.push(await timed(node));
  }
  console.log(`${name.padEnd(12)} GNU tar ${median(g).toFixed(0).padStart(6)}   node-tar ${median(t).toFixed(0).padStart(6)}   ${(median(t) / median(g)).toFixed(1)}x`);
}
// The single file: node-tar's stream first, so that the maximum RSS after it
// is its own; then the old way, reading the file whole.
const rssBefore = process.resourceUsage().maxRSS;
const up = [];
for (let i = 0; i < rounds; i++) up.push(await timed(() => sb.upload(big, '/tmp/big.bin')));
const rssStream = process.resourceUsage().maxRSS;
const old = [];
for (let i = 0; i < rounds; i++) old.push(await timed(() => sb.writeFile('/tmp/big.bin', readFileSync(big))));
const rssWhole = process.resourceUsage().maxRSS;
const mib = (kib) => `${(kib / 1024).toFixed(0)} MiB`;
console.log(`file 256 MiB  node-tar stream ${median(up).toFixed(0)} ms   read whole + write ${median(old).toFixed(0)} ms`);
console.log(`              max RSS ${mib(rssBefore)} before, ${mib(rssStream)} after the streams, ${mib(rssWhole)} after reading whole`);
await sb.close();
rmSync(work, { recursive: true, force: true });
