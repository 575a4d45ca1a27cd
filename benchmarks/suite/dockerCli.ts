/**
 * The suite's Docker access: the running engine or nothing. Unlike
 * benchmarks/lib/docker.ts's ensureDocker (which installs docker.io and
 * starts a dockerd when it must), the suite installs and starts nothing:
 * it says what is missing and how to get it, and runs without Docker.
 */
import { setMaxListeners } from 'node:events';
import { exec, execOk, isExecutable, which, type ExecResult } from '../lib/proc.js';

export interface DockerCli {
  cli: string;
  serverVersion: string;
}

/** Every container the suite makes has a name starting with this, and SUITE_LABEL. */
export const SUITE_NAME = 'msbx-suite';
/**
 * The runner's own label (msbx-suite=runner): the workload builder's images
 * and build containers carry other names, and cleanup must not touch them.
 */
export const SUITE_LABEL = 'msbx-suite=runner';

/** Aborted on an interrupt, killing the docker CLI processes running then (a `docker save` would go on writing gigabytes). */
let interrupt = newInterrupt();

function newInterrupt(): AbortController {
  const c = new AbortController();
  // Every running docker command listens on it: 256 at once when scaling.
  setMaxListeners(0, c.signal);
  return c;
}

export function killDockerClis(): void {
  interrupt.abort();
  // The cleanup that follows runs docker commands of its own.
  interrupt = newInterrupt();
}

/** Runs the docker CLI; throws naming the command and Docker's reason unless allowFail. */
export function docker(d: Pick<DockerCli, 'cli'>, args: readonly string[], opts: { input?: string; allowFail?: boolean; timeoutMs?: number } = {}): Promise<ExecResult> {
  const { allowFail, ...rest } = opts;
  const o = { ...rest, signal: interrupt.signal };
  return allowFail ? exec(d.cli, args, o) : execOk(d.cli, args, { ...o, what: `docker ${args.slice(0, 3).join(' ')}` });
}

/** The running engine, or what is missing and how to get it. */
export async function findDocker(): Promise<DockerCli | { missing: string }> {
  // docker.io's CLI first: it matches its engine's API.
  const cli = ['/usr/bin/docker', which('docker')].find((p): p is string => p !== undefined && isExecutable(p));
  if (!cli) return { missing: 'no docker CLI: install it with `apt-get install docker.io` (the suite installs nothing itself), or run with --no-docker' };
  const r = await docker({ cli }, ['info', '--format', '{{.ServerVersion}}'], { allowFail: true, timeoutMs: 15_000 });
  const version = r.stdout.trim();
  if (r.code !== 0 || !version || version.includes('<no value>')) {
    const daemon = which('dockerd') ? 'start it: `nohup dockerd >/var/log/dockerd.log 2>&1 &` (as root), or add this user to the docker group' : 'no dockerd: `apt-get install docker.io`, then start `dockerd`';
    return { missing: `the Docker engine does not answer \`docker info\` (${r.stderr.trim().split('\n').pop() ?? ''}); ${daemon}; or run with --no-docker` };
  }
  return { cli, serverVersion: version };
}

/** Removes every container carrying the suite's label (from this run or an interrupted earlier one). */
export async function removeSuiteContainers(d: Pick<DockerCli, 'cli'>): Promise<number> {
  const ids = (await docker(d, ['ps', '-aq', '--filter', `label=${SUITE_LABEL}`], { allowFail: true, timeoutMs: 60_000 })).stdout.split('\n').filter(Boolean);
  for (let i = 0; i < ids.length; i += 50) await docker(d, ['rm', '-f', ...ids.slice(i, i + 50)], { allowFail: true, timeoutMs: 120_000 });
  return ids.length;
}

/** An image's id, or undefined if the engine does not have it. */
export async function imageId(d: Pick<DockerCli, 'cli'>, ref: string): Promise<string | undefined> {
  const r = await docker(d, ['image', 'inspect', '--format', '{{.Id}}', ref], { allowFail: true, timeoutMs: 30_000 });
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** An image's uncompressed size in bytes (all its layers). */
export async function imageSize(d: Pick<DockerCli, 'cli'>, ref: string): Promise<number> {
  return Number((await docker(d, ['image', 'inspect', '--format', '{{.Size}}', ref], { timeoutMs: 30_000 })).stdout.trim());
}
