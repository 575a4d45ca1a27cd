/**
 * Docker as a comparison baseline: find or start an engine, import an image
 * from host files, stop what we started. Every failure is a DockerUnavailable
 * with a readable reason, so a benchmark can print it and skip Docker
 * instead of failing as a whole.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lstatSync } from 'node:fs';
import { policy } from '../../lib/index.js';
import { aptInstall, exec, isExecutable, lastLines, which } from './proc.js';

/** The image of the host files a default MiniSandbox root shows (see hostImagePaths). */
export const HOST_IMAGE = 'minisandbox-bench-host';

export class DockerUnavailable extends Error {}

export interface DockerHandle {
  /** The docker CLI binary that talks to this engine. */
  cli: string;
  /** ['-H', 'unix://…'] for a daemon we started on our own socket, [] for an existing one. */
  hostArgs: string[];
  serverVersion: string;
  startedByUs: boolean;
  daemon?: ChildProcess;
  tmpDir?: string;
  logFile?: string;
  /** The bridge interface made for a private dockerd, deleted when it stops. */
  bridge?: string;
}

type Log = (msg: string) => void;

/**
 * CLIs to try, engine-matched first: the docker.io package's /usr/bin/docker
 * goes with its dockerd, while a separately installed /usr/local/bin/docker
 * may be newer than that engine's API.
 */
function cliCandidates(): string[] {
  const paths = ['/usr/bin/docker', which('docker'), '/usr/local/bin/docker'];
  return [...new Set(paths.filter((p): p is string => p !== undefined && isExecutable(p)))];
}

/** The server version if `cli info` answers within a few seconds. */
async function probe(cli: string, hostArgs: string[]): Promise<string | undefined> {
  const r = await exec(cli, [...hostArgs, 'info', '--format', '{{.ServerVersion}}'], { timeoutMs: 10_000 });
  const version = r.stdout.trim();
  return r.code === 0 && version && !version.includes('<no value>') ? version : undefined;
}

/**
 * A working engine: an already running one (left alone later), or a dockerd
 * we start ourselves on a private socket with its log in a temp dir. Installs
 * docker.io with apt-get when dockerd is missing.
 */
export async function ensureDocker(log: Log, startTimeoutMs = 60_000): Promise<DockerHandle> {
  for (const cli of cliCandidates()) {
    const serverVersion = await probe(cli, []);
    if (serverVersion) {
      log(`using the running Docker engine ${serverVersion} via ${cli}`);
      return { cli, hostArgs: [], serverVersion, startedByUs: false };
    }
  }

  if (!which('dockerd')) {
    const err = await aptInstall(['docker.io'], log);
    if (err) throw new DockerUnavailable(`dockerd missing and ${err}`);
    if (!which('dockerd')) throw new DockerUnavailable('docker.io installed but no dockerd found');
  }
  const clis = cliCandidates();
  if (clis.length === 0) throw new DockerUnavailable('no docker CLI found');

  // A private socket and pidfile: no clash with a stale default socket, and
  // the CLI provably talks to the daemon we started. Images still go to the
  // default data root, so the imported image survives for the next run.
  return launchDockerd(log, clis, mkdtempSync(join(tmpdir(), 'minisandbox-dockerd-')), [], startTimeoutMs);
}

/**
 * A dockerd of our own on an empty data root, with its own exec root,
 * socket and pidfile and no bridge or iptables changes, for measurements
 * where Docker must start from nothing (loading an image whose layers it
 * does not have, the bytes its storage takes) without touching the engine
 * that tests and other benchmarks use. Containers need `--network none`.
 * Root only; stopDocker stops it and deletes its data root.
 */
export async function startPrivateDocker(log: Log, startTimeoutMs = 60_000): Promise<DockerHandle & { dataRoot: string }> {
  if (process.getuid?.() !== 0) throw new DockerUnavailable('a private dockerd needs root');
  const dockerd = which('dockerd');
  if (!dockerd) throw new DockerUnavailable('dockerd is not installed (apt-get install docker.io)');
  const clis = cliCandidates();
  if (clis.length === 0) throw new DockerUnavailable('no docker CLI found');
  // Its own bridge: with `--bridge none` dockerd deletes the host's docker0,
  // which the running engine's containers need; with the default it would
  // take over docker0. A /24 of 10.254/16 picked by pid keeps two benchmarks
  // apart; nothing is routed or masqueraded (containers use --network none).
  const bridge = `msbxb${process.pid % 100_000}`;
  const ip = (args: string[]) => exec('ip', args, { timeoutMs: 10_000 });
  const made = await ip(['link', 'add', bridge, 'type', 'bridge']);
  if (made.code !== 0) throw new DockerUnavailable(`ip link add ${bridge} type bridge failed: ${lastLines(made.stderr)}`);
  const up = [await ip(['addr', 'add', `10.254.${process.pid % 250}.1/24`, 'dev', bridge]), await ip(['link', 'set', bridge, 'up'])];
  if (up.some((r) => r.code !== 0)) {
    await ip(['link', 'del', bridge]);
    throw new DockerUnavailable(`bridge ${bridge} could not be set up: ${up.map((r) => lastLines(r.stderr)).join(' ')}`);
  }
  // /var/tmp, not a tmpfs: overlay2 needs a disk filesystem under its data root.
  const tmpDir = mkdtempSync('/var/tmp/minisandbox-dockerd-');
  const dataRoot = join(tmpDir, 'data');
  const extra = ['--data-root', dataRoot, '--exec-root', join(tmpDir, 'exec'), '--bridge', bridge, '--iptables=false', '--ip-masq=false', '--ip-forward=false'];
  try {
    return { ...(await launchDockerd(log, clis, tmpDir, extra, startTimeoutMs, bridge)), dataRoot };
  } catch (err) {
    await ip(['link', 'del', bridge]);
    throw err;
  }
}

async function launchDockerd(log: Log, clis: string[], tmpDir: string, extraArgs: string[], startTimeoutMs: number, bridge?: string): Promise<DockerHandle> {
  const logFile = join(tmpDir, 'dockerd.log');
  const sock = join(tmpDir, 'docker.sock');
  const hostArgs = ['-H', `unix://${sock}`];
  const logFd = openSync(logFile, 'a');
  log(`starting dockerd (log: ${logFile})`);
  const daemon = spawn(which('dockerd')!, ['--host', `unix://${sock}`, '--pidfile', join(tmpDir, 'dockerd.pid'), ...extraArgs], {
    stdio: ['ignore', logFd, logFd],
  });
  closeSync(logFd);
  const handle: DockerHandle = { cli: clis[0]!, hostArgs, serverVersion: '', startedByUs: true, daemon, tmpDir, logFile, ...(bridge ? { bridge } : {}) };
  // Safety net: never leave our dockerd behind if the benchmark exits early.
  if (activeDaemons.size === 0) process.once('exit', killOnExit);
  activeDaemons.add(daemon);

  let exited: string | undefined;
  daemon.on('error', (err) => (exited = String(err)));
  daemon.on('exit', (code, signal) => (exited = `dockerd exited (code ${code}, signal ${signal})`));

  const deadline = Date.now() + startTimeoutMs;
  while (Date.now() < deadline && !exited) {
    for (const cli of clis) {
      const serverVersion = await probe(cli, hostArgs);
      if (serverVersion) {
        log(`dockerd ${serverVersion} is up; CLI ${cli}`);
        return { ...handle, cli, serverVersion };
      }
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  const reason = exited ?? `docker info did not answer within ${startTimeoutMs / 1000} s`;
  const tail = lastLines(safeRead(logFile), 8);
  await stopDocker(handle, log, true);
  throw new DockerUnavailable(`${reason}; dockerd log tail:\n${tail}`);
}

/** The dockerds this process started and has not stopped (a benchmark may run two). */
const activeDaemons = new Set<ChildProcess>();
function killOnExit(): void {
  for (const d of activeDaemons) d.kill('SIGKILL');
}

function safeRead(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** [file, args] for a docker CLI call against this engine. */
export function dockerCommand(h: DockerHandle, args: readonly string[]): [string, string[]] {
  return [h.cli, [...h.hostArgs, ...args]];
}

/**
 * An image made of host files (paths relative to /), via `tar | docker import`:
 * no registry access needed. Reused when an image of that name already exists,
 * since tarring /usr takes minutes and its content does not affect start time.
 */
export async function importImage(h: DockerHandle, name: string, paths: readonly string[], log: Log): Promise<void> {
  const [cli, inspectArgs] = dockerCommand(h, ['image', 'inspect', '--format', '{{.Id}}', name]);
  if ((await exec(cli, inspectArgs, { timeoutMs: 30_000 })).code === 0) {
    log(`reusing existing image ${name}`);
    return;
  }
  log(`importing image ${name} from host ${paths.join(' ')} (may take a few minutes) ...`);
  const started = Date.now();
  const tar = spawn('tar', ['-C', '/', '-c', ...paths], { stdio: ['ignore', 'pipe', 'pipe'] });
  const [file, args] = dockerCommand(h, ['import', '-', name]);
  const imp = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  tar.stdout.pipe(imp.stdin);
  let tarErr = '';
  let impErr = '';
  tar.stderr.setEncoding('utf8').on('data', (d: string) => (tarErr += d));
  imp.stderr.setEncoding('utf8').on('data', (d: string) => (impErr += d));
  imp.stdout.resume();
  const done = (p: ChildProcess) =>
    new Promise<number | null>((resolve) => {
      p.on('error', () => resolve(127));
      p.on('close', (code) => resolve(code));
    });
  const [tarCode, impCode] = await Promise.all([done(tar), done(imp)]);
  // tar exits 1 for "file changed as we read it": harmless for a benchmark image.
  if (tarCode !== 0 && tarCode !== 1) throw new DockerUnavailable(`tar failed (${tarCode}): ${lastLines(tarErr)}`);
  if (impCode !== 0) throw new DockerUnavailable(`docker import failed (${impCode}): ${lastLines(impErr)}`);
  log(`imported ${name} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
}

/** Stop the dockerd we started (SIGTERM, then SIGKILL); leave a pre-existing engine alone. */
export async function stopDocker(h: DockerHandle, log: Log, keepLog = false): Promise<void> {
  if (!h.startedByUs || !h.daemon) return;
  const daemon = h.daemon;
  if (daemon.exitCode === null && daemon.signalCode === null) {
    const exited = new Promise<boolean>((resolve) => {
      daemon.once('exit', () => resolve(true));
      setTimeout(() => resolve(false), 30_000).unref();
    });
    daemon.kill('SIGTERM');
    if (!(await exited)) {
      log('dockerd did not stop within 30 s; killing it');
      daemon.kill('SIGKILL');
    }
  }
  activeDaemons.delete(daemon);
  if (activeDaemons.size === 0) process.removeListener('exit', killOnExit);
  if (h.bridge) await exec('ip', ['link', 'del', h.bridge], { timeoutMs: 10_000 });
  if (keepLog) log(`dockerd log kept at ${h.logFile}`);
  else if (h.tmpDir) rmSync(h.tmpDir, { recursive: true, force: true });
  log('stopped the dockerd this benchmark started');
}

/** The same files as the MiniSandbox root, as paths relative to / for tar. */
export function hostImagePaths(): string[] {
  const exists = (p: string) => {
    try {
      lstatSync(`/${p}`);
      return true;
    } catch {
      return false;
    }
  };
  return [
    ...policy.HOST_ROOT_DIRS.map((d) => d.slice(1)),
    ...policy.HOST_ETC_ENTRIES.map((e) => `etc/${e}`),
  ].filter(exists);
}

