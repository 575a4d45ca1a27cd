import { fork, type ChildProcess } from 'node:child_process';
import { mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { acquireLock, packDirectory } from '../../lib/files/index.js';
import { IoBudget, openStore } from '../../lib/layers/index.js';
import { tmpDir, transpiledLayers, writeTree } from './helpers.js';

/** Child process driver: real processes, the same code transpiled to .js. */
const CHILD = String.raw`
import path from 'node:path';
const lib = { ...(await import(process.env.LIB_JS + '/files/index.js')), ...(await import(process.env.LIB_JS + '/layers/index.js')) };
const [mode, ...args] = process.argv.slice(2);
const send = (m) => process.send(m);
if (mode === 'add') {
  const [root, archive] = args;
  const store = await lib.openStore({ root });
  let progress = 0;
  send({ ready: true });
  await new Promise((r) => process.once('message', r)); // start together
  const t0 = Date.now();
  const layer = await store.addArchive(archive, { onProgress: () => progress++ });
  send({ digest: layer.digest, path: layer.path, built: progress > 0, ms: Date.now() - t0 });
  process.exit(0);
} else if (mode === 'pin-while-alive') {
  const [root, dir] = args;
  const store = await lib.openStore({ root });
  const layer = await store.addDirectory(dir, { pin: { owner: 'build in child', whileAlive: true } });
  send({ digest: layer.digest });
  setInterval(() => {}, 1000); // alive until killed
} else if (mode === 'hold-lock') {
  const lock = await lib.acquireLock(args[0]);
  send({ locked: true });
  setInterval(() => {}, 1000); // hold until killed
} else if (mode === 'budget') {
  const [dir, maxBytes, maxConcurrent, bytes, times, holdMs] = args;
  const budget = new lib.IoBudget({ dir, maxBytes: Number(maxBytes), maxConcurrent: Number(maxConcurrent), pollMs: 20 });
  send({ ready: true });
  await new Promise((r) => process.once('message', r));
  const intervals = [];
  for (let i = 0; i < Number(times); i++) {
    const t = await budget.acquire(Number(bytes));
    const start = Date.now();
    await new Promise((r) => setTimeout(r, Number(holdMs)));
    const end = Date.now();
    await t.release();
    intervals.push([start, end, Number(bytes)]);
  }
  send({ intervals });
  process.exit(0);
} else if (mode === 'budget-hold') {
  const [dir, bytes] = args;
  const budget = new lib.IoBudget({ dir, maxBytes: 100, maxConcurrent: 1, pollMs: 20 });
  await budget.acquire(Number(bytes));
  send({ holding: true });
  setInterval(() => {}, 1000);
}
`;

const t = tmpDir('conc');
let script = '';
let libJs = '';
beforeAll(() => {
  libJs = transpiledLayers(path.join(t.dir, 'js'));
  script = path.join(t.dir, 'js', 'child.mjs');
  writeFileSync(script, CHILD);
});
afterAll(() => t.cleanup());

function start(args: string[]): { child: ChildProcess; messages: Array<Record<string, unknown>>; next: () => Promise<Record<string, unknown>> } {
  const child = fork(script, args, { env: { ...process.env, LIB_JS: libJs }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const messages: Array<Record<string, unknown>> = [];
  const waiters: Array<(m: Record<string, unknown>) => void> = [];
  child.on('message', (m) => {
    const w = waiters.shift();
    if (w) w(m as Record<string, unknown>);
    else messages.push(m as Record<string, unknown>);
  });
  return {
    child,
    messages,
    next: () =>
      new Promise((resolve, reject) => {
        const m = messages.shift();
        if (m) return resolve(m);
        waiters.push(resolve);
        child.once('exit', (code) => reject(new Error(`child exited ${code} before replying`)));
      }),
  };
}

const exited = (c: ChildProcess) => new Promise<void>((r) => (c.exitCode !== null || c.signalCode !== null ? r() : c.once('exit', () => r())));

/** Largest total of bytes / count of intervals overlapping at any instant. */
function peak(intervals: Array<[number, number, number]>): { bytes: number; count: number } {
  const events = intervals.flatMap(([s, e, b]) => [
    [s, b, 1],
    [e, -b, -1],
  ]);
  events.sort((a, b) => a[0]! - b[0]! || a[2]! - b[2]!); // ends before starts at equal times
  let bytes = 0;
  let count = 0;
  let pb = 0;
  let pc = 0;
  for (const [, b, c] of events) {
    bytes += b!;
    count += c!;
    pb = Math.max(pb, bytes);
    pc = Math.max(pc, count);
  }
  return { bytes: pb, count: pc };
}

describe('lock: build exactly once across processes', () => {
  it('10 processes race to add the same cold archive: one unpacks, all get the same layer', async () => {
    const src = path.join(t.dir, 'race-src');
    const files: Record<string, string> = {};
    for (let i = 0; i < 300; i++) files[`pkg${i % 10}/m${i}.py`] = `x = ${i}\n`.repeat(50);
    writeTree(src, files);
    const archive = path.join(t.dir, 'race.tar.zst');
    await packDirectory(src, archive);
    const root = path.join(t.dir, 'race-store');
    const kids = Array.from({ length: 10 }, () => start(['add', root, archive]));
    for (const k of kids) await k.next();
    for (const k of kids) k.child.send('go');
    const results = await Promise.all(kids.map((k) => k.next()));
    await Promise.all(kids.map((k) => exited(k.child)));
    expect(results.filter((r) => r.built)).toHaveLength(1);
    expect(new Set(results.map((r) => r.digest)).size).toBe(1);
    expect(new Set(results.map((r) => r.path)).size).toBe(1);
    expect(readdirSync(path.join(root, 'staging'))).toEqual([]);
    const store = await openStore({ root });
    expect((await store.list()).map((l) => l.manifest.fileCount)).toEqual([300]);
  });

  it('a holder killed by SIGKILL does not block: the next waiter gets the lock and builds', async () => {
    const src = path.join(t.dir, 'kill-src');
    writeTree(src, { 'a.txt': 'a' });
    const archive = path.join(t.dir, 'kill.tar.zst');
    await packDirectory(src, archive);
    const root = path.join(t.dir, 'kill-store');
    const store = await openStore({ root });
    const { createHash } = await import('node:crypto');
    const { readFileSync } = await import('node:fs');
    const digest = createHash('sha256').update(readFileSync(archive)).digest('hex');
    // A crashed builder: holds the layer lock and left a half-built staging dir.
    mkdirSync(path.join(root, 'staging', `${digest}.999999-1.dead`, 'tree'), { recursive: true });
    const holder = start(['hold-lock', path.join(root, 'locks', `${digest}.lock`)]);
    expect(await holder.next()).toEqual({ locked: true });
    let done = false;
    const adding = store.addArchive(archive).then((l) => ((done = true), l));
    await new Promise((r) => setTimeout(r, 300));
    expect(done).toBe(false); // really waiting on the holder
    const killedAt = Date.now();
    holder.child.kill('SIGKILL');
    const layer = await adding;
    const waitedAfterKill = Date.now() - killedAt;
    console.log(`[lock] waiter proceeded ${waitedAfterKill} ms after the holder was SIGKILLed`);
    expect(waitedAfterKill).toBeLessThan(2000);
    expect(layer.manifest.fileCount).toBe(1);
    expect(readdirSync(path.join(root, 'staging'))).toEqual([]); // stale half layer cleaned
  });

  it('times out with a clear error while another process holds the lock', async () => {
    const lockPath = path.join(t.dir, 'held.lock');
    const holder = start(['hold-lock', lockPath]);
    await holder.next();
    await expect(acquireLock(lockPath, { timeoutMs: 200, what: 'layer test' })).rejects.toThrow(
      /layer test: timed out after 200 ms waiting for .*held\.lock/,
    );
    holder.child.kill('SIGKILL');
    await exited(holder.child);
    const lock = await acquireLock(lockPath, { timeoutMs: 2000 });
    await lock.release();
  });
});

describe('pins and gc across processes', () => {
  it("a build's whileAlive pin keeps its layer while the process lives, and goes with it", async () => {
    const root = path.join(t.dir, 'pin-alive-store');
    const src = path.join(t.dir, 'pin-alive-src');
    writeTree(src, { 'a.txt': 'a' });
    const child = start(['pin-while-alive', root, src]);
    const { digest } = (await child.next()) as { digest: string };
    const store = await openStore({ root });
    expect(await store.gc()).toMatchObject({ removedLayers: [], removedPins: 0 });
    expect((await store.pins()).map((p) => p.owner)).toEqual(['build in child']);
    child.child.kill('SIGKILL');
    await exited(child.child);
    expect(await store.pins()).toEqual([]);
    expect(await store.gc()).toMatchObject({ removedLayers: [digest], removedPins: 1 });
  });

  it('gc never waits on a layer someone holds (a pin being made, a verify): it keeps it for the next run', async () => {
    const root = path.join(t.dir, 'pin-busy-store');
    const src = path.join(t.dir, 'pin-busy-src');
    writeTree(src, { 'b.txt': 'b' });
    const store = await openStore({ root });
    const layer = await store.addDirectory(src);
    const holder = start(['hold-lock', path.join(root, 'locks', `${layer.digest}.lock`)]);
    await holder.next();
    expect(await store.gc()).toMatchObject({ removedLayers: [], busyLayers: [layer.digest] });
    holder.child.kill('SIGKILL');
    await exited(holder.child);
    expect(await store.gc()).toMatchObject({ removedLayers: [layer.digest], busyLayers: [] });
  });
});

describe('budget: bytes in flight and concurrent unpacks', () => {
  it('in-process: 12 acquisitions never exceed maxBytes=100 / maxConcurrent=2; progress events flow', async () => {
    const budget = new IoBudget({ dir: path.join(t.dir, 'budget-a'), maxBytes: 100, maxConcurrent: 2, pollMs: 20 });
    const progress: number[] = [];
    budget.on('progress', (p) => progress.push(p.done));
    const intervals: Array<[number, number, number]> = [];
    let inFlight = 0;
    let inFlightBytes = 0;
    let maxSeen = 0;
    let maxBytesSeen = 0;
    const sizes = [40, 40, 40, 70, 10, 10, 30, 60, 20, 40, 50, 5];
    await Promise.all(
      sizes.map(async (b) => {
        const ticket = await budget.acquire(b);
        inFlight++;
        inFlightBytes += b;
        maxSeen = Math.max(maxSeen, inFlight);
        maxBytesSeen = Math.max(maxBytesSeen, inFlightBytes);
        const s = Date.now();
        ticket.progress(b / 2);
        // Held until a second ticket runs beside it (up to 3 s: a budget that
        // ran one at a time still shows peak 1), then 40 ms: under load the
        // next acquire's lock-file work can outlast a short fixed hold.
        const until = Date.now() + 3000;
        while (maxSeen < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
        await new Promise((r) => setTimeout(r, 40));
        ticket.progress(b);
        inFlight--;
        inFlightBytes -= b;
        intervals.push([s, Date.now(), b]);
        await ticket.release();
      }),
    );
    console.log(`[budget in-process] peak ${maxSeen} concurrent, ${maxBytesSeen} bytes (limits 2, 100)`);
    expect(maxSeen).toBeLessThanOrEqual(2);
    expect(maxBytesSeen).toBeLessThanOrEqual(100);
    expect(maxSeen).toBe(2); // and it does run things concurrently
    expect(progress).toHaveLength(sizes.length * 2);
    expect(await budget.usage()).toEqual({ running: 0, runningBytes: 0, waiting: 0 });
  });

  it('across 4 processes: byte limit and count limit hold', async () => {
    const dirB = path.join(t.dir, 'budget-b');
    // 60-byte unpacks under a 100-byte budget: never two at once.
    const kidsB = Array.from({ length: 4 }, () => start(['budget', dirB, '100', '8', '60', '3', '60']));
    for (const k of kidsB) await k.next();
    for (const k of kidsB) k.child.send('go');
    const byBytes = (await Promise.all(kidsB.map((k) => k.next()))).flatMap((m) => m.intervals as Array<[number, number, number]>);
    const dirC = path.join(t.dir, 'budget-c');
    // Tiny unpacks, at most 2 concurrent.
    const kidsC = Array.from({ length: 4 }, () => start(['budget', dirC, '1000000', '2', '1', '3', '60']));
    for (const k of kidsC) await k.next();
    for (const k of kidsC) k.child.send('go');
    const byCount = (await Promise.all(kidsC.map((k) => k.next()))).flatMap((m) => m.intervals as Array<[number, number, number]>);
    console.log(`[budget cross-process] bytes-limited peak ${JSON.stringify(peak(byBytes))}, count-limited peak ${JSON.stringify(peak(byCount))}`);
    expect(byBytes).toHaveLength(12);
    expect(peak(byBytes).bytes).toBeLessThanOrEqual(100);
    expect(peak(byCount).count).toBeLessThanOrEqual(2);
    expect(peak(byCount).count).toBe(2);
  });

  it('a holder killed by SIGKILL frees its bytes; an oversize request runs when alone', async () => {
    const dir = path.join(t.dir, 'budget-d');
    const holder = start(['budget-hold', dir, '90']);
    expect(await holder.next()).toEqual({ holding: true });
    const budget = new IoBudget({ dir, maxBytes: 100, maxConcurrent: 1, pollMs: 20 });
    expect(await budget.usage()).toMatchObject({ running: 1, runningBytes: 90 });
    let got = false;
    const p = budget.acquire(50).then((tk) => ((got = true), tk));
    await new Promise((r) => setTimeout(r, 200));
    expect(got).toBe(false);
    holder.child.kill('SIGKILL');
    await exited(holder.child);
    const ticket = await p;
    await ticket.release();
    const big = await budget.acquire(5000); // larger than the whole budget: admitted when nothing else runs
    await big.release();
  });
});
