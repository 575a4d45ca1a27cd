/**
 * The container-image fixtures (issue 11) as the tests see them: where
 * scripts/test-images.sh left the archives, whether Docker and the loopback
 * registry can be used by the user running the tests, and if not, why, as a
 * string for vitest's `describe.skipIf(reason)` / `it.skipIf(reason)`:
 *
 *   const f = imageFixtures();
 *   describe.skipIf(f.skip)('import of a docker save archive', ...)      // archives
 *   it.skipIf(f.dockerSkip)('prints what docker run prints', ...)          // docker
 *   it.skipIf(f.registrySkip)('pulls from the registry', ...)              // registry
 *
 * or, so that the reporter shows the reason, `skipWith(ctx, f.dockerSkip)`
 * in a test or a beforeEach.
 *
 * The fixtures are real images built on this machine (see the script's
 * header and test/images/docker/); test/images/fixtures.test.ts checks they
 * are what the tests rely on. Probes are synchronous (so the results exist
 * when vitest collects the tests) and made once per test file.
 */
import { spawn, spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { userInfo } from 'node:os';
import { join } from 'node:path';

/** The images in Docker (and, base excepted, in the registry under REGISTRY/NAME). */
export const IMAGES = { base: 'msbx-test/base:1', app: 'msbx-test/app:1', app2: 'msbx-test/app2:1' } as const;
/** The loopback registry scripts/test-images.sh starts (plain HTTP). */
export const REGISTRY = '127.0.0.1:5000';
/** app:1 and app2:1 as pushed there (the base is not pushed on its own; both images carry it). */
export const REGISTRY_IMAGES = { app: `${REGISTRY}/msbx-test/app:1`, app2: `${REGISTRY}/msbx-test/app2:1` } as const;
/** What `app:1` is built to show (test/images/docker/app/Dockerfile). */
export const APP = {
  uid: 1000,
  gid: 1000,
  user: 'dev',
  workdir: '/home/dev/project',
  env: { GREETING: 'hello', PATH: '/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' },
  cmd: ['python3', '-c', "print('app')"],
  /** Deleted by the top layer (a `.wh.issue` whiteout). */
  deleted: '/etc/issue',
  /** Removed and made again by the top layer (opaque): holds only README = "replaced\n". */
  opaqueDir: '/usr/share/doc',
  /** Only in app2:1's own layer. */
  app2Marker: '/opt/app2/marker',
} as const;

export interface ImageFixtures {
  /** /var/cache/minisandbox/images (or $MSBX_CACHE/images, as for the script). */
  dir: string;
  /** `docker save` archives of msbx-test/app:1, app2:1 and base:1. */
  app: string;
  app2: string;
  base: string;
  /** OCI image layout directory of app:1 (skopeo), its image tagged `appOciTag`. */
  appOci: string;
  appOciTag: 'app';
  /** Why the archives and the OCI layout cannot be used; undefined when they can. */
  skip?: string;
  /** Whether this user can run the docker CLI against an engine that holds the msbx-test images. */
  docker: boolean;
  dockerSkip?: string;
  /** The docker CLI used (docker.io's, matching its engine, when present). */
  dockerCli: string;
  /** `127.0.0.1:5000` when its GET /v2/ answers and it holds msbx-test/app:1; else undefined. */
  registry?: string;
  registrySkip?: string;
  /**
   * Set by .ci/run (MSBX_IMAGE_FIXTURES=required) once it made the fixtures
   * and checked msbx-ci can use Docker: then fixtures.test.ts fails instead
   * of skipping when something is missing.
   */
  required: boolean;
}

const HINT = 'run scripts/test-images.sh as root (.ci/run does)';
let cached: ImageFixtures | undefined;

export function imageFixtures(): ImageFixtures {
  if (cached) return cached;
  const dir = join(process.env.MSBX_CACHE ?? '/var/cache/minisandbox', 'images');
  const paths = { app: join(dir, 'app.tar'), app2: join(dir, 'app2.tar'), base: join(dir, 'base.tar'), appOci: join(dir, 'app-oci') };
  const dockerCli = dockerCliPath();
  const dockerSkip = probeDocker(dockerCli);
  const registrySkip = probeRegistry();
  cached = {
    dir,
    ...paths,
    appOciTag: 'app',
    skip: probeArchives([paths.app, paths.app2, paths.base, join(paths.appOci, 'index.json')]),
    docker: dockerSkip === undefined,
    dockerSkip,
    dockerCli,
    registry: registrySkip === undefined ? REGISTRY : undefined,
    registrySkip,
    required: process.env.MSBX_IMAGE_FIXTURES === 'required',
  };
  return cached;
}

function probeArchives(files: string[]): string | undefined {
  for (const f of files) {
    try {
      accessSync(f, constants.R_OK);
    } catch (e) {
      return `image fixture ${f} is not readable by ${userName()} (${(e as NodeJS.ErrnoException).code}): ${HINT}`;
    }
  }
  return undefined;
}

/**
 * docker.io's CLI goes with docker.io's engine; a newer CLI elsewhere in
 * PATH (e.g. /usr/local/bin/docker) is only a fallback.
 */
function dockerCliPath(): string {
  try {
    accessSync('/usr/bin/docker', constants.X_OK);
    return '/usr/bin/docker';
  } catch {
    return 'docker';
  }
}

function userName(): string {
  try {
    return userInfo().username;
  } catch {
    return `uid ${process.getuid?.()}`;
  }
}

function firstLine(text: string): string {
  return text.trim().split('\n')[0] ?? '';
}

function probeDocker(cli: string): string | undefined {
  const who = userName();
  const version = spawnSync(cli, ['version', '--format', '{{.Server.Version}}'], { encoding: 'utf8', timeout: 20_000 });
  if (version.error && (version.error as NodeJS.ErrnoException).code === 'ENOENT') {
    return 'docker is not installed (no docker CLI in PATH): .ci/run installs docker.io';
  }
  if (version.status !== 0) {
    const err = version.stderr || String(version.error ?? `exit ${version.status}`);
    if (/permission denied/i.test(err)) {
      return `docker is not usable by ${who}: permission denied on /var/run/docker.sock; .ci/run adds it to the docker group`;
    }
    return `docker is not usable by ${who}: ${firstLine(err)}; scripts/test-images.sh (run by .ci/run as root) starts dockerd`;
  }
  const images = Object.values(IMAGES);
  const inspect = spawnSync(cli, ['image', 'inspect', '--format', '{{.Id}}', ...images], { encoding: 'utf8', timeout: 20_000 });
  if (inspect.status !== 0) {
    return `docker works but lacks the test images (${firstLine(inspect.stderr)}): ${HINT}`;
  }
  return undefined;
}

/**
 * GET /v2/ and a HEAD of app:1's manifest, made by a child Node (fetch is
 * asynchronous; the probe must answer before the tests are collected).
 */
function probeRegistry(): string | undefined {
  const script = `
    const base = 'http://${REGISTRY}/v2/';
    const accept = 'application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json';
    (async () => {
      const root = await fetch(base, { signal: AbortSignal.timeout(4000) });
      if (root.status !== 200) throw new Error('GET ' + base + ' answered ' + root.status);
      const m = await fetch(base + 'msbx-test/app/manifests/1', { method: 'HEAD', headers: { accept }, signal: AbortSignal.timeout(4000) });
      if (m.status !== 200) throw new Error('it does not hold msbx-test/app:1 (HEAD of its manifest answered ' + m.status + ')');
    })().catch((e) => { process.stderr.write(String(e.cause?.code ?? e.message ?? e)); process.exit(1); });`;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 15_000 });
  if (r.status === 0) return undefined;
  return `no usable registry on ${REGISTRY} (${firstLine(r.stderr) || `probe ended with ${r.signal ?? r.status}`}): ${HINT}`;
}

export interface DockerRunResult {
  stdout: string;
  stderr: string;
  /** The container's exit code as `docker run` passes it through (128+N for a signal). */
  exitCode: number;
}

/**
 * `docker run --rm --network none [args...] IMAGE ARGV...`, output
 * captured: the reference that `minisandbox image run IMAGE -- ARGV` is
 * compared with. `args` go before the image (e.g. ['-e', 'X=1'],
 * ['--entrypoint', 'sh']). No network by default, as a sandbox has none
 * (`network: 'bridge'` for Docker's default); `input` is written to stdin.
 */
export function dockerRun(
  image: string,
  argv: readonly string[] = [],
  opts: { args?: readonly string[]; timeoutMs?: number; input?: string; network?: string } = {},
): Promise<DockerRunResult> {
  const { dockerCli } = imageFixtures();
  const runArgs = ['run', '--rm', '--network', opts.network ?? 'none', ...(opts.input !== undefined ? ['-i'] : []), ...(opts.args ?? [])];
  return new Promise((resolve, reject) => {
    const child = spawn(dockerCli, [...runArgs, image, ...argv], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.stdin.end(opts.input ?? '');
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`docker run ${image} could not start ${dockerCli}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (signal) reject(new Error(`docker run ${image} ${argv.join(' ')} was killed (${signal}) after ${opts.timeoutMs ?? 60_000} ms; stderr: ${stderr}`));
      else resolve({ stdout, stderr, exitCode: code ?? -1 });
    });
  });
}

/**
 * Skips the current test with the reason, which vitest's reporters show
 * (describe.skipIf(reason) skips silently): call it in a test or in a
 * `beforeEach((ctx) => skipWith(ctx, imageFixtures().dockerSkip))`.
 */
export function skipWith(ctx: { skip(note?: string): void }, reason: string | false | undefined): void {
  if (reason) ctx.skip(reason);
}
