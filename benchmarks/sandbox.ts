/**
 * Persistent sandboxes, measured in one run:
 * - Sandbox.create() + first command done (target: median <= 15 ms), and
 *   its stages as Node sees them (see Stage);
 * - exec of `true` in a running sandbox (target: median <= 2 ms, and at
 *   least 20x faster than `docker exec` into a running container), and of
 *   /bin/true against the same process spawned from inside the sandbox
 *   (the floor: what the path from Node adds to a process creation);
 * - a session.run('true') round trip (target: median <= 2 ms);
 * - a 400-byte command and a 25 KB heredoc typed into the session's bash
 *   (--noediting: whole lines from the terminal) against a bash with
 *   readline (a byte per read, editing work per byte), in ABBA order;
 * - the syntax check of an agent's command (quotes, a pipe, `$`), which
 *   session.run does on the host first: a spawned `bash -n` per check (as
 *   before the checker, kept here as the peer) against the long-lived
 *   checker, back to back and one per step (a session.run between checks,
 *   as in a rollout), and for a 100 KB heredoc (target: median < 1 ms);
 * - 256 sandboxes created concurrently: total time, sandboxes per second,
 *   memory per idle sandbox (target: under 4 MB besides the shell).
 *
 *   node dist/benchmarks/sandbox.js [--iterations N] [--concurrent N] [--no-docker] [--json]
 */
import { readFileSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import { performance } from 'node:perf_hooks';
import { Sandbox, native, terminalChannel } from '../lib/index.js';
import { ShellSession } from '../lib/shell/session.js';
import { checkBashSyntax, spawnBashN } from '../lib/shell/syntax.js';
import { HOST_IMAGE, dockerCommand, ensureDocker, hostImagePaths, importImage, stopDocker } from './lib/docker.js';
import { count, flag, readArgs } from './lib/args.js';
import { exec } from './lib/proc.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { summarize, timeMany, timePair, type Summary } from './lib/stats.js';

interface Options {
  iterations: number;
  concurrent: number;
  docker: boolean;
  json: boolean;
}

const USAGE = 'usage: node dist/benchmarks/sandbox.js [--iterations N] [--concurrent N] [--no-docker] [--json]';

function parseOptions(): Options {
  const v = readArgs(USAGE, { iterations: count(200), concurrent: count(256), 'no-docker': flag(), json: flag() });
  return { iterations: v.iterations, concurrent: v.concurrent, docker: !v['no-docker'], json: v.json };
}

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

/** A command of the kind agents send: quotes, a pipe and `$`, so not trivially valid. */
const AGENT_COMMAND = `grep -rn "def main" src/ | head -n 5 && echo "done in $PWD"`;

/** An agent writing a file with a heredoc: ~100 KB of Python. */
function heredoc100k(): string {
  const body = Array.from({ length: 4000 }, (_, i) => `value_${i} = "x" * ${i}  # $HOME \`q\` 'single'\n`).join('').slice(0, 100_000);
  return `cat > /tmp/big.py <<'EOF'\n${body}\nEOF\n`;
}

/** Proportional set size of a process tree's members, in bytes. */
function pssOf(pid: number): number {
  try {
    const line = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8').split('\n').find((l) => l.startsWith('Pss:'));
    return line ? Number(line.split(/\s+/)[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

function memAvailable(): number {
  const line = readFileSync('/proc/meminfo', 'utf8').split('\n').find((l) => l.startsWith('MemAvailable:'));
  return Number(line!.split(/\s+/)[1]) * 1024;
}

/**
 * Where a create + first command spends its time, from Node's side:
 * prepare (options to plan), spawn (the spawner's clone of PID 1 with its
 * namespaces, synchronous), setup (PID 1's mounts and pivot until the
 * sandbox is ready), enter (the spawner's fork of the command's monitor,
 * synchronous), command (setns, the exec, the command, its status back).
 */
type Stage = 'prepare' | 'spawn' | 'setup' | 'enter' | 'command';

function markNative(): { clear(): void; get(): Record<'spawn0' | 'spawn1' | 'enter0' | 'enter1', number>; restore(): void } {
  const at: Record<string, number> = {};
  const originals = { spawn: native.spawn, enter: native.enter };
  for (const name of ['spawn', 'enter'] as const) {
    const orig = originals[name] as (...args: unknown[]) => unknown;
    (native as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => {
      at[`${name}0`] = performance.now();
      try {
        return orig.apply(native, args);
      } finally {
        at[`${name}1`] = performance.now();
      }
    };
  }
  return {
    clear: () => {
      for (const k of Object.keys(at)) delete at[k];
    },
    get: () => at as Record<'spawn0' | 'spawn1' | 'enter0' | 'enter1', number>,
    restore: () => Object.assign(native, originals),
  };
}

/** posix_spawn + waitpid of /bin/true, timed inside the sandbox by the host's python3 (median and p95, ms), or why not. */
async function spawnInside(sb: Sandbox, n: number): Promise<{ median: number; p95: number } | string> {
  const script = [
    'import os, time',
    'xs = []',
    `for i in range(${n + 10}):`,
    '    t = time.perf_counter()',
    "    pid = os.posix_spawn('/bin/true', ['/bin/true'], {})",
    '    os.waitpid(pid, 0)',
    '    xs.append((time.perf_counter() - t) * 1000)',
    'xs = sorted(xs[10:])',
    'print(xs[len(xs) // 2], xs[int(len(xs) * 0.95)])',
  ].join('\n');
  const r = await sb.exec(['/usr/bin/python3', '-c', script]);
  if (r.exitCode !== 0) return `skipped: python3 in the sandbox exited ${r.exitCode}: ${r.stderr.trim()}`;
  const [median, p95] = r.stdout.trim().split(' ').map(Number);
  return { median: median!, p95: p95! };
}

async function dockerExec(o: Options): Promise<Summary | string> {
  if (!o.docker) return 'skipped (--no-docker)';
  let handle;
  try {
    handle = await ensureDocker(log);
    await importImage(handle, HOST_IMAGE, hostImagePaths(), log);
    const [cli, runArgs] = dockerCommand(handle, ['run', '-d', '--rm', '--network', 'none', HOST_IMAGE, '/usr/bin/sleep', 'infinity']);
    const started = await exec(cli, runArgs, { timeoutMs: 60_000 });
    if (started.code !== 0) return `docker run failed: ${started.stderr.trim()}`;
    const id = started.stdout.trim();
    try {
      const [c, args] = dockerCommand(handle, ['exec', id, '/usr/bin/true']);
      const samples = await timeMany(30, 3, async () => {
        const r = await exec(c, args, { timeoutMs: 30_000 });
        if (r.code !== 0) throw new Error(`docker exec failed: ${r.stderr}`);
      });
      return summarize(samples);
    } finally {
      const [c, args] = dockerCommand(handle, ['kill', id]);
      await exec(c, args, { timeoutMs: 30_000 });
    }
  } catch (e) {
    return `skipped: ${(e as Error).message}`;
  } finally {
    if (handle) await stopDocker(handle, log);
  }
}

async function main(): Promise<void> {
  const o = parseOptions();
  const results: Record<string, unknown> = {};

  log(`create + first command: ${o.iterations / 4} runs`);
  const createSamples: number[] = [];
  const stageSamples: Record<Stage, number[]> = { prepare: [], spawn: [], setup: [], enter: [], command: [] };
  const marks = markNative();
  for (let i = 0; i < o.iterations / 4 + 3; i++) {
    marks.clear();
    const t = performance.now();
    const sb = await Sandbox.create();
    const created = performance.now();
    await sb.exec(['true']);
    const end = performance.now();
    if (i >= 3) {
      createSamples.push(end - t);
      const m = marks.get();
      for (const [stage, ms] of Object.entries({ prepare: m.spawn0 - t, spawn: m.spawn1 - m.spawn0, setup: created - m.spawn1, enter: m.enter1 - m.enter0, command: end - m.enter1 })) stageSamples[stage as Stage].push(ms);
    }
    await sb.close();
  }
  marks.restore();
  const create = summarize(createSamples);
  const stages = Object.fromEntries(Object.entries(stageSamples).map(([k, v]) => [k, summarize(v)])) as Record<Stage, Summary>;

  const sb = await Sandbox.create();
  // What the seccomp filter costs an exec: the same command in a sandbox
  // without it, in ABBA order.
  const unfiltered = await Sandbox.create({ seccomp: 'none' });
  log(`exec true, with and without the seccomp filter: ${o.iterations} runs each, ABBA`);
  const [filteredSamples, unfilteredSamples] = await timePair(o.iterations, 10, () => sb.exec(['true']), () => unfiltered.exec(['true']));
  const execTrue = summarize(filteredSamples);
  const execNoFilter = summarize(unfilteredSamples);
  await unfiltered.close();
  // The floor under an exec: the same process started and waited for from
  // inside the sandbox (posix_spawn in a Python loop), so the difference is
  // what the path from Node adds (the spawner's request, the monitor's
  // fork and setns, the status back to Node).
  log(`exec /bin/true from Node against posix_spawn of it inside the sandbox, ${o.iterations} runs each`);
  const execBinTrue = summarize(await timeMany(o.iterations, 10, () => sb.exec(['/bin/true'])));
  const insideSpawn = await spawnInside(sb, o.iterations);
  const session = await sb.shell();
  log(`session.run('true'): ${o.iterations} runs`);
  const sessionTrue = summarize(await timeMany(o.iterations, 10, () => session.run('true')));
  log(`long commands typed: the session's bash against a bash with readline, ABBA`);
  const readlineBash = sb.spawn(['/bin/bash', '--norc', '--noprofile'], { pty: { cols: 80, rows: 24 } });
  await readlineBash.ready;
  const readline = await ShellSession.start(terminalChannel(readlineBash));
  const typed = async (s: ShellSession, command: string) => {
    const r = await s.run(command, { check: 'silent' });
    if (r.exitCode !== 0) throw new Error(`typed command exited ${r.exitCode}: ${r.output.slice(0, 200)}`);
  };
  const line400 = `: ${'x'.repeat(398)}`;
  const heredoc25k = heredoc100k().slice(-25_000).replace(/^[^\n]*\n/, "cat > /dev/null <<'EOF'\n");
  const summarizePair = ([a, b]: [number[], number[]]): [Summary, Summary] => [summarize(a), summarize(b)];
  const [short, shortReadline] = summarizePair(await timePair(o.iterations / 4, 5, () => typed(session, line400), () => typed(readline, line400)));
  const [long, longReadline] = summarizePair(await timePair(Math.max(4, o.iterations / 20), 1, () => typed(session, heredoc25k), () => typed(readline, heredoc25k)));
  await readline.close();
  log(`syntax check: spawned bash -n against the checker, ${o.iterations} runs each`);
  const expectOk = (r: { ok: boolean; stderr: string }) => {
    if (!r.ok) throw new Error(`syntax check failed: ${r.stderr}`);
  };
  const checkOld = summarize(await timeMany(o.iterations, 10, async () => expectOk(await spawnBashN(AGENT_COMMAND))));
  const checkNew = summarize(await timeMany(o.iterations, 10, async () => expectOk(await checkBashSyntax(AGENT_COMMAND))));
  const checkStep = summarize(await timeMany(o.iterations, 10, async () => expectOk(await checkBashSyntax(AGENT_COMMAND)), () => session.run('true')));
  const big = heredoc100k();
  const bigN = Math.max(10, o.iterations / 10);
  const checkBigOld = summarize(await timeMany(bigN, 3, async () => expectOk(await spawnBashN(big))));
  const checkBigNew = summarize(await timeMany(bigN, 3, async () => expectOk(await checkBashSyntax(big)), () => session.run('true')));
  await session.close();
  await sb.close();

  log(`${o.concurrent} sandboxes created concurrently`);
  const memBefore = memAvailable();
  const t0 = performance.now();
  const many = await Promise.allSettled(Array.from({ length: o.concurrent }, () => Sandbox.create()));
  const totalMs = performance.now() - t0;
  const ok = many.filter((r): r is PromiseFulfilledResult<Sandbox> => r.status === 'fulfilled').map((r) => r.value);
  const failed = many.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
  await new Promise((r) => setTimeout(r, 500)); // let the kernel settle its accounting
  const memPerSandbox = (memBefore - memAvailable()) / Math.max(1, ok.length);
  const pssPerInit = ok.reduce((sum, s) => sum + pssOf(s.pid), 0) / Math.max(1, ok.length);
  const answers = await Promise.all(ok.map((s) => s.exec(['true']).then((r) => r.exitCode === 0)));
  await Promise.all(ok.map((s) => s.close()));

  const docker = await dockerExec(o);

  Object.assign(results, {
    create,
    createStages: stages,
    execTrue,
    execNoFilter,
    execBinTrue,
    insideSpawn,
    sessionTrue,
    typed: { line400: { session: short, readline: shortReadline }, heredoc25k: { bytes: Buffer.byteLength(heredoc25k), session: long, readline: longReadline } },
    syntaxCheck: { command: AGENT_COMMAND, spawned: checkOld, checker: checkNew, checkerPerStep: checkStep, heredoc100k: { spawned: checkBigOld, checkerPerStep: checkBigNew } },
    docker,
    concurrent: { requested: o.concurrent, created: ok.length, failed, totalMs, perSecond: (ok.length / totalMs) * 1000, allAnswered: answers.every(Boolean) },
    memory: { perSandboxBytes: memPerSandbox, pssPerInitBytes: pssPerInit },
  });
  if (o.json) {
    process.stdout.write(JSON.stringify(results, null, 2) + '\n');
    return;
  }
  const row = (name: string, s: Summary) => [name, String(s.n), formatMs(s.median), formatMs(s.p95), formatMs(s.mean)];
  const rows = [['', 'n', 'median', 'p95', 'mean'], row('Sandbox.create + first exec', create), row('exec true (running sandbox)', execTrue), row("exec true, seccomp 'none'", execNoFilter), row("session.run('true')", sessionTrue), row('400-byte command, session (no readline)', short), row('400-byte command, bash with readline', shortReadline), row('25 KB heredoc, session (no readline)', long), row('25 KB heredoc, bash with readline', longReadline), row('syntax check, spawned bash -n (before)', checkOld), row('syntax check, checker, back to back', checkNew), row('syntax check, checker, one per step', checkStep), row('100 KB heredoc, spawned bash -n', checkBigOld), row('100 KB heredoc, checker, one per step', checkBigNew)];
  if (typeof docker !== 'string') rows.push(row('docker exec true (running container)', docker));
  const verdict = (ok: boolean) => (ok ? 'PASS' : 'FAIL');
  const lines = [
    `persistent sandboxes, node ${process.version}, kernel ${release()}, ${cpus().length} CPUs, load ${loadavg().map((l) => l.toFixed(2)).join(' ')}`,
    '',
    formatTable(rows),
    '',
    `create + first command median ${formatMs(create.median)} (target <= 15 ms): ${verdict(create.median <= 15)}`,
    `  by stage (medians): ${Object.entries(stages).map(([k, v]) => `${k} ${formatMs(v.median)}`).join(', ')}`,
    `exec true median ${formatMs(execTrue.median)} (target <= 2 ms): ${verdict(execTrue.median <= 2)}`,
    `exec median / exec without the seccomp filter median = ${formatRatio(execTrue.median / execNoFilter.median)} (target <= 1.1): ${verdict(execTrue.median / execNoFilter.median <= 1.1)}`,
    typeof docker === 'string'
      ? `docker exec: ${docker}`
      : `docker exec median / exec median = ${formatRatio(docker.median / execTrue.median)} (target >= 20): ${verdict(docker.median / execTrue.median >= 20)}`,
    typeof insideSpawn === 'string'
      ? `exec /bin/true against a spawn inside: ${insideSpawn}`
      : `exec /bin/true median ${formatMs(execBinTrue.median)}, posix_spawn + wait of it inside the sandbox ${formatMs(insideSpawn.median)}: the path from Node adds ${formatMs(execBinTrue.median - insideSpawn.median)} (${formatRatio(execBinTrue.median / insideSpawn.median)} the bare process)`,
    `session.run('true') median ${formatMs(sessionTrue.median)} (target <= 2 ms): ${verdict(sessionTrue.median <= 2)}`,
    `typed without readline: 400-byte command ${formatMs(short.median)} against ${formatMs(shortReadline.median)} with readline (${formatRatio(shortReadline.median / short.median)} faster), 25 KB heredoc ${formatMs(long.median)} against ${formatMs(longReadline.median)} (${formatRatio(longReadline.median / long.median)})`,
    `syntax check median: spawned bash -n ${formatMs(checkOld.median)}, checker ${formatMs(checkNew.median)} back to back (${formatRatio(checkOld.median / checkNew.median)} faster), ${formatMs(checkStep.median)} one per step (${formatRatio(checkOld.median / checkStep.median)} faster; target < 1 ms): ${verdict(checkStep.median < 1)}`,
    `100 KB heredoc check median: spawned bash -n ${formatMs(checkBigOld.median)}, checker ${formatMs(checkBigNew.median)} (${formatRatio(checkBigOld.median / checkBigNew.median)})`,
    `${o.concurrent} concurrent creates: ${ok.length} ok, ${failed.length} failed${failed.length ? ` (${failed[0]})` : ''}, ${formatMs(totalMs)} total, ${((ok.length / totalMs) * 1000).toFixed(0)} sandboxes/s, all answered: ${answers.every(Boolean)}`,
    `memory per idle sandbox: ${(memPerSandbox / 1024 / 1024).toFixed(2)} MB by MemAvailable, ${(pssPerInit / 1024 / 1024).toFixed(2)} MB PSS of its PID 1 (target < 4 MB): ${verdict(memPerSandbox < 4 * 1024 * 1024)}`,
  ];
  process.stdout.write(lines.join('\n') + '\n');
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  // Sandboxes still open would keep Node waiting: they die with it.
  process.exit(1);
});
