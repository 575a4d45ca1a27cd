/**
 * Sandboxes from images: the image's layers as the root (under the
 * sandbox's private writable layer), and its config applied as Docker
 * applies it: Env (PATH included), WorkingDir as the cwd (made if the image
 * lacks it, as Docker does), User (a name or uid[:gid], names looked up in
 * the image's own /etc/passwd and /etc/group), Entrypoint and Cmd.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { adopt } from '../errors.js';
import type { LayerStore } from '../layers/index.js';
import {
  idRangeSupport,
  run,
  Sandbox,

  type Command,
  type ExecOptions,
  type ExecResult,
  type Mount,
  type ProcessOptions,
  type RunOptions,
  type RunResult,
  type SandboxCreateOptions,
  type SandboxProcess,
} from '../sandbox/index.js';
import { FILE_CAPABILITIES } from '../sandbox/policy.js';
import { ImageError } from './errors.js';
import { getImage, imageLayers, type ImageRecord } from './images.js';

/** Docker's PATH for an image that sets none. */
export const DOCKER_DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface ImageProcessSettings {
  /** The image's Env over Docker's defaults (PATH, HOME), then the caller's. */
  env: Record<string, string>;
  cwd: string;
  user: { uid: number; gid: number };
  /** The cwd does not exist in the image: the sandbox makes it. */
  makeCwd: boolean;
  /** Capabilities root inside keeps (Docker's root may edit any file of its image). */
  capabilities: string[];
}

export interface ImageSandboxOptions extends Omit<SandboxCreateOptions, 'root' | 'cwd' | 'env'> {
  /** Added to (and over) the image's Env. */
  env?: Record<string, string>;
  /** Instead of the image's WorkingDir. */
  workdir?: string;
  /** Instead of the image's User: a name, uid or uid:gid (name:group). */
  user?: string;
  /** Extra read-only layers (host directories) above the image's, highest priority first. */
  layers?: string[];
}

/** A layer path's entry, honouring whiteouts of the layers above: undefined if deleted or absent. */
async function lookupInLayers(layers: string[], rel: string): Promise<{ layer: string; path: string; isFile: boolean; isDir: boolean } | undefined> {
  const parts = rel.split('/').filter(Boolean);
  for (const layer of layers) {
    let p = layer;
    let gone = false;
    let absent = false;
    for (const [i, c] of parts.entries()) {
      p = path.join(p, c);
      const st = await fsp.lstat(p).catch(() => undefined);
      if (!st) {
        absent = true;
        break;
      }
      // A 0/0 character device is a whiteout: the name is deleted from here down.
      if (st.isCharacterDevice() && st.rdev === 0) {
        gone = true;
        break;
      }
      if (i < parts.length - 1 && !st.isDirectory()) {
        absent = true;
        break;
      }
      if (i === parts.length - 1) return { layer, path: p, isFile: st.isFile(), isDir: st.isDirectory() };
    }
    if (gone) return undefined;
    void absent;
  }
  return undefined;
}

async function readImageFile(layers: string[], rel: string): Promise<string | undefined> {
  const hit = await lookupInLayers(layers, rel);
  if (!hit?.isFile) return undefined;
  return fsp.readFile(hit.path, 'utf8').catch(() => undefined);
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

function parsePasswd(text: string | undefined): PasswdEntry[] {
  return (text ?? '')
    .split('\n')
    .map((l) => l.split(':'))
    .filter((f) => f.length >= 7 && /^\d+$/.test(f[2]!) && /^\d+$/.test(f[3]!))
    .map((f) => ({ name: f[0]!, uid: Number(f[2]), gid: Number(f[3]), home: f[5]! }));
}

function parseGroup(text: string | undefined): { name: string; gid: number }[] {
  return (text ?? '')
    .split('\n')
    .map((l) => l.split(':'))
    .filter((f) => f.length >= 3 && /^\d+$/.test(f[2]!))
    .map((f) => ({ name: f[0]!, gid: Number(f[2]) }));
}

/**
 * uid and gid of Docker's USER string in the image: `name`, `uid`,
 * `name:group`, `uid:gid`... A name the image's /etc/passwd lacks is an
 * error (as in Docker); a numeric uid absent from it runs with gid 0.
 */
export async function resolveImageUser(layers: string[], user: string | undefined, label: string): Promise<{ uid: number; gid: number; home: string }> {
  if (user === undefined || user === '') user = '0';
  const [u, g] = user.split(':', 2) as [string, string | undefined];
  const passwd = parsePasswd(await readImageFile(layers, 'etc/passwd'));
  const entry = /^\d+$/.test(u) ? passwd.find((p) => p.uid === Number(u)) : passwd.find((p) => p.name === u);
  if (!entry && !/^\d+$/.test(u)) throw new ImageError(`${label}: user ${JSON.stringify(u)} is not in the image's /etc/passwd`);
  const uid = entry?.uid ?? Number(u);
  let gid = entry?.gid ?? 0;
  if (g !== undefined && g !== '') {
    if (/^\d+$/.test(g)) gid = Number(g);
    else {
      const grp = parseGroup(await readImageFile(layers, 'etc/group')).find((x) => x.name === g);
      if (!grp) throw new ImageError(`${label}: group ${JSON.stringify(g)} is not in the image's /etc/group`);
      gid = grp.gid;
    }
  }
  if (uid > 65535 || gid > 65535) throw new ImageError(`${label}: user ${user} is ${uid}:${gid}, outside the 0-65535 a sandbox maps`);
  return { uid, gid, home: entry?.home ?? '/' };
}

function envOf(list: string[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of list ?? []) {
    const i = e.indexOf('=');
    if (i > 0) out[e.slice(0, i)] = e.slice(i + 1);
  }
  return out;
}

/** What a process of the image gets: env, cwd, user, as `docker run` would give them. */
export async function imageProcessSettings(
  rec: ImageRecord,
  layers: string[],
  over: { env?: Record<string, string>; workdir?: string; user?: string } = {},
): Promise<ImageProcessSettings> {
  const label = `image ${rec.names[0] ?? rec.id.slice(0, 12)}`;
  const squashed = rec.owners === 'squashed';
  const who = await resolveImageUser(layers, over.user ?? rec.config.User, label);
  // Squashed owners: every file is root's inside, so the image's user could
  // not write what it owns in Docker; it runs as root (inspect says so).
  const user = squashed ? { uid: 0, gid: 0 } : { uid: who.uid, gid: who.gid };
  const cwd = over.workdir ?? rec.config.WorkingDir ?? '/';
  if (!path.isAbsolute(cwd)) throw new ImageError(`${label}: working directory ${JSON.stringify(cwd)} is not absolute`);
  const env: Record<string, string> = { PATH: DOCKER_DEFAULT_PATH, HOME: who.home, ...envOf(rec.config.Env), ...(over.env ?? {}) };
  const hit = await lookupInLayers(layers, cwd);
  return { env, cwd, user, makeCwd: !hit?.isDir, capabilities: user.uid === 0 ? FILE_CAPABILITIES : [] };
}

/** Sandbox options for an image's root: its layers (top first) plus the caller's, ids 'range' where it can. */
function rootOptions(rec: ImageRecord, layers: string[], extra: string[] | undefined, settings: ImageProcessSettings): { root: { layers: string[] }; ids?: 'range'; mounts: Mount[] } {
  const support = idRangeSupport();
  const range = support.ok;
  const label = `image ${rec.names[0] ?? rec.id.slice(0, 12)}`;
  // Only the caller's own id is mapped without a range: another user inside could not exist.
  if (!support.ok && (settings.user.uid !== 0 || settings.user.gid !== 0))
    throw new ImageError(`${label}: runs as ${settings.user.uid}:${settings.user.gid}, which needs ids: 'range' (${support.reason})`);
  const mounts: Mount[] = settings.makeCwd ? [{ type: 'dir', target: settings.cwd, mode: 0o755 }] : [];
  return { root: { layers: [...(extra ?? []), ...layers] }, ...(range ? { ids: 'range' as const } : {}), mounts };
}

/**
 * Holds an image's layers while a sandbox uses them: a pin that counts
 * while this process lives, dropped by the returned function. Without it,
 * `image rm` and `gc` could delete the lower dirs of a running sandbox.
 * Pinned before the layers' paths are taken, so gc cannot slip in between.
 */
async function holdLayers(store: LayerStore, rec: ImageRecord): Promise<{ layers: string[]; release: () => Promise<void> }> {
  const owner = `image-sandbox:${rec.id}:${process.pid}:${randomBytes(6).toString('hex')}`;
  try {
    await store.hold(owner, rec.layers, { label: `sandbox of image ${rec.names[0] ?? rec.id.slice(0, 12)}` });
  } catch (err) {
    throw new ImageError(`image ${rec.names[0] ?? rec.id.slice(0, 12)}: its layers are not all in the store (${(err as Error).message}); import or pull it again`, { cause: err });
  }
  const release = async () => {
    await store.unpin(owner).catch(() => undefined);
  };
  try {
    return { layers: (await imageLayers(store, rec)).map((l) => l.path), release };
  } catch (err) {
    await release();
    throw err;
  }
}

/** A sandbox on an image, whose commands run as the image's user, in its working directory, with its environment. */
export class ImageSandbox implements AsyncDisposable {
  constructor(
    readonly sandbox: Sandbox,
    readonly image: ImageRecord,
    readonly settings: ImageProcessSettings,
    private readonly release: () => Promise<void> = async () => undefined,
  ) {}

  get id(): string {
    return this.sandbox.id;
  }

  private defaults<T extends Omit<ProcessOptions, 'argv'>>(opts: T): T {
    return { user: this.settings.user, ...(this.settings.user.uid === 0 ? { capabilities: this.settings.capabilities } : {}), ...opts };
  }

  exec(cmd: Command, opts: ExecOptions & { encoding: 'buffer' }): Promise<ExecResult<Buffer>>;
  exec(cmd: Command, opts?: ExecOptions): Promise<ExecResult<string>>;
  exec(cmd: Command, opts: ExecOptions = {}): Promise<ExecResult<string | Buffer>> {
    return this.sandbox.exec(cmd, this.defaults(opts));
  }

  spawn(cmd: Command, opts: Omit<ProcessOptions, 'argv'> = {}): SandboxProcess {
    return this.sandbox.spawn(cmd, this.defaults(opts));
  }

  async close(): Promise<void> {
    try {
      await this.sandbox.close();
    } finally {
      await this.release();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * A persistent sandbox on image `ref` (a name, id or id prefix). Extra
 * layers, mounts, binds and limits stack on top as for any sandbox.
 */
export async function createImageSandbox(store: LayerStore, ref: string, opts: ImageSandboxOptions = {}): Promise<ImageSandbox> {
  const { env, workdir, user, layers: extra, mounts = [], ...rest } = opts;
  const rec = await getImage(store, ref);
  const { layers, release } = await holdLayers(store, rec);
  try {
    const settings = await imageProcessSettings(rec, layers, { ...(env ? { env } : {}), ...(workdir ? { workdir } : {}), ...(user ? { user } : {}) });
    const root = rootOptions(rec, layers, extra, settings);
    const sandbox = await Sandbox.create({ ...root, ...rest, mounts: [...root.mounts, ...mounts], env: settings.env, cwd: settings.cwd });
    return new ImageSandbox(sandbox, rec, settings, release);
  } catch (err) {
    await release();
    throw adopt(err, ImageError);
  }
}

export interface RunImageOptions extends Omit<RunOptions, 'argv' | 'root' | 'cwd' | 'env' | 'user'> {
  env?: Record<string, string>;
  workdir?: string;
  user?: string;
  layers?: string[];
  /** Instead of the image's Entrypoint (`[]` clears it), as `docker run --entrypoint`. */
  entrypoint?: string[];
}

/** The command `docker run IMAGE [argv...]` runs: Entrypoint + (argv, else Cmd). */
export function imageCommand(rec: ImageRecord, argv?: string[], entrypoint?: string[]): string[] {
  const ep = entrypoint ?? rec.config.Entrypoint ?? [];
  const cmd = argv && argv.length > 0 ? argv : entrypoint !== undefined ? [] : (rec.config.Cmd ?? []);
  const full = [...ep, ...cmd];
  if (full.length === 0) throw new ImageError(`image ${rec.names[0] ?? rec.id.slice(0, 12)}: no command given and the image has no Entrypoint or Cmd`);
  return full;
}

/**
 * `docker run --rm IMAGE [argv...]`: one command in a throwaway sandbox of
 * the image (its writable layer a tmpfs), Entrypoint and Cmd as Docker
 * combines them; the result carries the exit code. stdio may be 'inherit'.
 */
export async function runImage(store: LayerStore, ref: string, argv?: string[], opts: RunImageOptions = {}): Promise<RunResult<string>> {
  const { env, workdir, user, layers: extra, entrypoint, mounts = [], ...rest } = opts;
  const rec = await getImage(store, ref);
  const command = imageCommand(rec, argv, entrypoint);
  const { layers, release } = await holdLayers(store, rec);
  try {
    const settings = await imageProcessSettings(rec, layers, { ...(env ? { env } : {}), ...(workdir ? { workdir } : {}), ...(user ? { user } : {}) });
    const root = rootOptions(rec, layers, extra, settings);
    return await run({
      ...root,
      ...rest,
      mounts: [...root.mounts, ...mounts],
      argv: command,
      env: settings.env,
      cwd: settings.cwd,
      user: settings.user,
      ...(settings.user.uid === 0 && rest.capabilities === undefined ? { capabilities: settings.capabilities } : {}),
      encoding: 'utf8',
    });
  } catch (err) {
    throw adopt(err, ImageError);
  } finally {
    await release();
  }
}
