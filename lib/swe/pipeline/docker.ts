/**
 * The Docker side of per-task isolation: a task marked `isolation:
 * 'docker'` runs the same eval scripts in a container of its image, through
 * the docker CLI (no daemon library: the CLI is what users have and what
 * SWE-bench's harness drives through docker-py, with the same API calls).
 *
 * A container lives for one evaluation: `docker create` (no network, root,
 * a sleeping PID 1 so that every step is a `docker exec`, as SWE-bench's
 * harness does), the repository copied in when the task brings one, each
 * step `docker exec`, then `docker rm -f`, always: after a timeout or an
 * abort (which kill the container), and on Ctrl-C or SIGTERM of this
 * process (a signal handler held while containers exist). A container left
 * by a process that died without running any handler (SIGKILL) carries its
 * owner in a label, and the next process to start one on this host removes
 * it once the owner is gone.
 */
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { processIsAlive, selfStartTime } from '../../files/proc.js';
import type { Limits } from '../../sandbox/limits.js';
import { SweError } from '../errors.js';
import type { TaskExecResult, TaskSandbox } from './types.js';

/** `docker` on PATH, or MINISANDBOX_DOCKER (a wrapper, another CLI with docker's arguments). */
export function dockerBinary(): string {
  return process.env.MINISANDBOX_DOCKER || 'docker';
}

const OWNER_LABEL = 'minisandbox.swe.owner';

interface DockerResult {
  stdout: string;
  stderr: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  durationMs: number;
}

/** Runs the docker CLI to its end; never rejects for a non-zero exit (the caller decides). */
function docker(args: string[], opts: { input?: string; onSpawn?: (kill: () => void) => void } = {}): Promise<DockerResult> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const child = spawn(dockerBinary(), args, { stdio: [opts.input !== undefined ? 'pipe' : 'ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (b: Buffer) => out.push(b));
    child.stderr!.on('data', (b: Buffer) => err.push(b));
    child.stdin?.on('error', () => undefined); // a command that does not read its input
    child.on('error', (e) => reject(new SweError(`docker ${args[0]}: cannot run ${dockerBinary()}: ${e.message}`, { cause: e })));
    child.on('close', (code, signal) =>
      resolve({
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
        code,
        signal,
        durationMs: performance.now() - started,
      }),
    );
    opts.onSpawn?.(() => child.kill('SIGKILL'));
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

/** docker ARGS, rejecting with its stderr when it fails: `what` names the thing done. */
async function dockerOk(what: string, args: string[]): Promise<string> {
  const r = await docker(args);
  if (r.code !== 0) throw new SweError(`${what}: docker ${args[0]} failed (${r.signal ?? `exit ${r.code}`}): ${r.stderr.trim() || r.stdout.trim()}`);
  return r.stdout;
}

let engine: Promise<string | undefined> | undefined;

/**
 * Why Docker cannot be used here, or undefined when it can: the CLI runs
 * and reaches an engine (asked once per process).
 */
export function dockerUnavailable(): Promise<string | undefined> {
  engine ??= docker(['version', '--format', '{{.Server.Version}}']).then(
    (r) => (r.code === 0 && r.stdout.trim() !== '' ? undefined : `docker cannot reach an engine: ${(r.stderr.trim() || `exit ${r.code}`).split('\n')[0]}`),
    (e: unknown) => `docker is not installed: ${(e as Error).message}`,
  );
  return engine;
}

/**
 * The task's image in Docker, by the id Docker gives it: a `docker save` or
 * OCI archive file is loaded (`docker load`), a reference Docker does not
 * have is pulled (`docker pull`; Docker itself allows plain HTTP to a
 * registry on loopback). `fetched` says whether anything was loaded or pulled.
 */
export async function ensureDockerImage(image: string, file: boolean): Promise<{ id: string; fetched: boolean }> {
  const why = await dockerUnavailable();
  if (why) throw new SweError(`image ${image}: ${why}`);
  let ref = image;
  let fetched = false;
  if (file) {
    const loaded = await dockerOk(`image ${image}`, ['load', '--input', image]);
    // "Loaded image: name:tag" or "Loaded image ID: sha256:..." (an untagged archive).
    const m = /^Loaded image(?: ID)?: (\S+)$/m.exec(loaded);
    if (!m) throw new SweError(`image ${image}: docker load named no image: ${loaded.trim()}`);
    ref = m[1]!;
    fetched = true;
  } else if ((await docker(['image', 'inspect', '--format', '{{.Id}}', ref])).code !== 0) {
    await dockerOk(`image ${image}: not in Docker, and pulling it`, ['pull', '--quiet', ref]);
    fetched = true;
  }
  const id = (await dockerOk(`image ${image}`, ['image', 'inspect', '--format', '{{.Id}}', ref])).trim();
  return { id, fetched };
}

/** Docker's id of `ref` when its engine has that image; undefined otherwise (or without Docker). */
export async function dockerImageId(ref: string): Promise<string | undefined> {
  if (await dockerUnavailable()) return undefined;
  const r = await docker(['image', 'inspect', '--format', '{{.Id}}', ref]);
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** `docker save` of `ref` into `file`: an image Docker has, for the store to import. */
export async function dockerSave(ref: string, file: string): Promise<void> {
  await dockerOk(`image ${ref}`, ['save', '--output', file, ref]);
}

// Containers of this process, removed on exit and on a terminating signal.
const live = new Set<string>();
const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

function removeLiveSync(): void {
  if (live.size === 0) return;
  spawnSync(dockerBinary(), ['rm', '--force', ...live], { stdio: 'ignore', timeout: 60_000 });
  live.clear();
}

function onSignal(signal: NodeJS.Signals): void {
  removeLiveSync();
  unhook();
  // Without our handler the signal has its usual effect: if no one else
  // listens, this process ends as it would have.
  if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
}

let hooked = false;
function hook(): void {
  if (hooked) return;
  hooked = true;
  process.on('exit', removeLiveSync);
  for (const s of SIGNALS) process.on(s, onSignal);
}

function unhook(): void {
  if (!hooked) return;
  hooked = false;
  process.off('exit', removeLiveSync);
  for (const s of SIGNALS) process.off(s, onSignal);
}

/** host:pid:start-time of this process: who owns a container, even after the pid is reused. */
function ownerTag(): string {
  return `${hostname()}:${process.pid}:${selfStartTime()}`;
}

let swept: Promise<void> | undefined;

/** Removes containers left by processes of this host that died without removing them. */
function sweepOrphans(): Promise<void> {
  swept ??= (async () => {
    const r = await docker(['ps', '--all', '--filter', `label=${OWNER_LABEL}`, '--format', `{{.ID}}\t{{.Label "${OWNER_LABEL}"}}`]);
    if (r.code !== 0) return;
    const dead = r.stdout
      .split('\n')
      .map((line) => line.split('\t'))
      .filter(([id, owner]) => {
        const [host, pid, start] = (owner ?? '').split(':');
        return id && host === hostname() && pid && start && !processIsAlive(Number(pid), start);
      })
      .map(([id]) => id!);
    if (dead.length) await docker(['rm', '--force', ...dead]);
  })();
  return swept;
}

function limitArgs(limits: Limits | undefined): string[] {
  const args: string[] = [];
  if (limits?.memory !== undefined) args.push('--memory', String(limits.memory));
  if (limits?.cpu !== undefined) args.push('--cpus', String(limits.cpu));
  if (limits?.pids !== undefined && limits.pids !== null) args.push('--pids-limit', String(limits.pids));
  return args;
}

export interface DockerSandboxOptions {
  /** Docker's image id (ensureDockerImage). */
  imageId: string;
  /** For the container's name and messages. */
  instanceId: string;
  repoDir: string;
  /** A directory to copy to repoDir, replacing what the image has there. */
  repoSource?: string;
  limits?: Limits;
}

/**
 * A running container of the image, as a TaskSandbox: exec is `docker exec`,
 * close is `docker rm -f`. A command that times out or is aborted kills the
 * whole container (a `docker exec` client killed would leave its process
 * running inside): nothing can run in it afterwards, which is all an
 * evaluation needs, since a timeout ends it.
 */
export async function createDockerSandbox(o: DockerSandboxOptions): Promise<TaskSandbox> {
  const why = await dockerUnavailable();
  if (why) throw new SweError(`task ${o.instanceId}: ${why}`);
  await sweepOrphans();
  const name = `msbx-swe-${o.instanceId.toLowerCase().replace(/[^a-z0-9_.-]/g, '-').slice(0, 40)}-${randomBytes(4).toString('hex')}`;
  hook();
  live.add(name);
  const remove = async () => {
    await docker(['rm', '--force', name]);
    live.delete(name);
    if (live.size === 0) unhook();
  };
  try {
    await dockerOk(`task ${o.instanceId}: container of image ${o.imageId}`, [
      'create',
      '--name', name,
      '--label', `${OWNER_LABEL}=${ownerTag()}`,
      // As in a sandbox: no network, and root (SWE-bench's harness runs as root too).
      '--network', 'none',
      '--user', '0:0',
      ...limitArgs(o.limits),
      '--entrypoint', 'sleep',
      o.imageId,
      'infinity',
    ]);
    await dockerOk(`task ${o.instanceId}: starting container ${name}`, ['start', name]);
    if (o.repoSource !== undefined) {
      // The task's checkout replaces what the image has at repoDir, as the
      // sandbox's overlay of the repo layer hides it.
      const dir = o.repoDir.replace(/\/+$/, '');
      await dockerOk(`task ${o.instanceId}: preparing ${dir}`, ['exec', name, '/bin/sh', '-c', 'rm -rf "$1" && mkdir -p "$1"', 'sh', dir]);
      await dockerOk(`task ${o.instanceId}: copying the repository to ${dir}`, ['cp', `${o.repoSource}/.`, `${name}:${dir}`]);
    }
  } catch (err) {
    await remove();
    throw err;
  }

  let closed = false;
  return {
    async exec(cmd, opts = {}): Promise<TaskExecResult> {
      if (closed) throw new SweError(`task ${o.instanceId}: container ${name} is closed`);
      const argv = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
      let timedOut = false;
      let killClient = () => {};
      // docker kill ends every process of the container; the exec client
      // then returns by itself (and is killed if it does not).
      const killContainer = () => {
        void docker(['kill', name]).finally(() => setTimeout(killClient, 5_000).unref());
      };
      const timer = opts.timeout !== undefined ? setTimeout(() => ((timedOut = true), killContainer()), opts.timeout) : undefined;
      const onAbort = () => killContainer();
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      try {
        if (opts.signal?.aborted) throw new SweError(`task ${o.instanceId}: aborted`);
        const r = await docker(['exec', ...(opts.input !== undefined ? ['--interactive'] : []), name, ...argv], {
          ...(opts.input !== undefined ? { input: typeof opts.input === 'string' ? opts.input : opts.input.toString('utf8') } : {}),
          onSpawn: (kill) => (killClient = kill),
        });
        if (opts.signal?.aborted) throw new SweError(`task ${o.instanceId}: aborted`);
        // exec's own failures (no such container, no such command) are 126/127
        // with docker's message on stderr, as a shell reports them.
        return { stdout: r.stdout, stderr: r.stderr, exitCode: timedOut ? null : r.code, timedOut, durationMs: r.durationMs };
      } finally {
        if (timer) clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
      }
    },
    async close() {
      if (closed) return;
      closed = true;
      await remove();
    },
  };
}

/** Containers this process has running now (for tests: none must be left). */
export function liveDockerContainers(): string[] {
  return [...live];
}
