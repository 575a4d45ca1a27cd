/**
 * A sandbox on an env: the repo at repoPath and the venv at venvPath, each
 * with a private writable layer, the base interpreter at its own path, and
 * the venv activated (PATH, VIRTUAL_ENV), starting in the repo.
 *
 * Writes, deletions and renames in one sandbox land in that sandbox's own
 * upper (or, for the extraction baseline, its extracted copy), never in the
 * store or another sandbox.
 */
import path from 'node:path';
import type { IoBudget, Layer } from '../layers/index.js';
import {
  Sandbox,
  type Command,
  type ExecOptions,
  type ExecResult,
  type Mount,
  type ProcessOptions,
  type SandboxCreateOptions,
  type SandboxProcess,
} from '../sandbox/index.js';
import { FILE_CAPABILITIES } from '../sandbox/policy.js';
import { EnvError } from './errors.js';
import { basePythonMounts, venvVariables } from './layout.js';
import type { Env } from './manifest.js';
import { placeExtracted, placeOverlay, type Placement, type Rewrite } from './placeLayer.js';
import { createPrivateTree, type PrivateTree } from './privateTree.js';
import { checkEnvPath } from './recipe.js';

export interface EnvSandboxOptions extends SandboxCreateOptions {
  /** Mount the venv here instead of where it was built (relocation). */
  venvPath?: string;
  /** Mount the repo here instead of where it was built (relocation). */
  repoPath?: string;
  /**
   * A repo layer to mount instead of the env's own: another commit of the
   * same repository (buildRepo), so one env serves many. Mounted at
   * repoPath, else the env's repoPath.
   */
  repo?: Layer;
}

export interface EnvSandboxSetup {
  /** Files rewritten for relocation, per layer. */
  rewritten: { venv: string[]; repo: string[] };
  /** Total time of createEnvSandbox, ms. */
  totalMs: number;
}

export class EnvSandbox implements AsyncDisposable {
  constructor(
    readonly sandbox: Sandbox,
    readonly env: Env,
    readonly venvPath: string,
    readonly repoPath: string | undefined,
    readonly setup: EnvSandboxSetup,
    private readonly scratch: PrivateTree | undefined,
  ) {}

  get id(): string {
    return this.sandbox.id;
  }

  /** Runs a command in the env (venv active, cwd the repo); see Sandbox.exec. */
  exec(cmd: Command, opts: ExecOptions & { encoding: 'buffer' }): Promise<ExecResult<Buffer>>;
  exec(cmd: Command, opts?: ExecOptions): Promise<ExecResult<string>>;
  exec(cmd: Command, opts: ExecOptions = {}): Promise<ExecResult<string | Buffer>> {
    return this.sandbox.exec(cmd, opts);
  }

  spawn(cmd: Command, opts: Omit<ProcessOptions, 'argv'> = {}): SandboxProcess {
    return this.sandbox.spawn(cmd, opts);
  }

  /** Closes the sandbox, then removes its private trees (relocated files, extracted copies). */
  async close(): Promise<void> {
    await this.sandbox.close();
    await this.scratch?.remove();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * Starts a sandbox on `env`: its layers overlay-mounted from the store, so
 * setup is a few mounts whatever the env's size. Moving the venv or the
 * repo to another path rewrites only the files the manifests list, in a
 * private upper layer.
 */
export function createEnvSandbox(env: Env, opts: EnvSandboxOptions = {}): Promise<EnvSandbox> {
  return startEnvSandbox(env, opts, undefined);
}

/**
 * createEnvSandbox, or with `extract` the per-instance extraction baseline
 * (extractBaseline.ts): every layer's archive unpacked into a private tree
 * under that I/O budget.
 */
export async function startEnvSandbox(env: Env, opts: EnvSandboxOptions, extract: { budget: IoBudget } | undefined): Promise<EnvSandbox> {
  const started = performance.now();
  // Store layers are read-only (files 0444, dirs 0555) so that no host
  // process can alter a shared, hard-linked inode; without these, root in the
  // sandbox (holding no capabilities by default) could not edit the repo it
  // was given. Every process of an env sandbox, shells included, gets them
  // unless the caller names its own.
  const { venvPath: venvOpt, repoPath: repoOpt, repo: repoOverride, capabilities = FILE_CAPABILITIES, ...sandboxOpts } = opts;
  if (repoOverride && extract) throw new EnvError(`env ${env.id}: a repo layer of its own cannot be extracted (the baseline unpacks the env's archives)`);
  const repo = repoOverride ?? env.repo;
  // Where the repo was built: the env's path for its own layer, the layer's recorded prefix for another.
  const repoBuiltAt = repoOverride ? (repoOverride.manifest.prefix ?? env.repoPath) : env.repoPath;
  const venvPath = venvOpt !== undefined ? checkEnvPath('venvPath', venvOpt) : env.venvPath;
  const repoPath = repo ? (repoOpt !== undefined ? checkEnvPath('repoPath', repoOpt) : (env.repoPath ?? repoBuiltAt)) : undefined;
  if (repoOpt !== undefined && !repo) throw new EnvError(`env ${env.id}: repoPath given but the env has no repo`);
  if (repo && !repoPath) throw new EnvError(`env ${env.id}: repo layer ${repo.digest} has no recorded path; give repoPath`);

  // What to rewrite in each layer when it moves (both lists come from the build).
  const venvRewrites: Rewrite[] = [{ from: env.venvPath, to: venvPath, files: env.venv.manifest.prefixFiles ?? [] }];
  if (env.repoPath && repoPath) venvRewrites.push({ from: env.repoPath, to: repoPath, files: env.manifest.venv.repoPrefixFiles });
  const repoRewrites: Rewrite[] = repo && repoBuiltAt && repoPath ? [{ from: repoBuiltAt, to: repoPath, files: repo.manifest.prefixFiles ?? [] }] : [];

  let scratch: PrivateTree | undefined;
  const scratchDir = async (name: string): Promise<string> => {
    scratch ??= createPrivateTree(sandboxOpts.stateDir);
    return path.join(scratch.dir, name);
  };
  try {
    const placed: { venv?: Placement; repo?: Placement } = {};
    if (!extract) {
      placed.venv = await placeOverlay(env.venv, venvPath, venvRewrites, () => scratchDir('venv'));
      if (repo && repoPath) placed.repo = await placeOverlay(repo, repoPath, repoRewrites, () => scratchDir('repo'));
    } else {
      placed.venv = await placeExtracted(env.venv, env.archives.venv, venvPath, venvRewrites, await scratchDir('venv'), extract.budget);
      if (env.repo && repoPath) placed.repo = await placeExtracted(env.repo, env.archives.repo, repoPath, repoRewrites, await scratchDir('repo'), extract.budget);
    }
    const layers = [placed.repo, placed.venv].filter((p): p is Placement => p !== undefined);
    const mounts: Mount[] = [
      // A layers root shows nothing of the host, as 'empty' does.
      ...basePythonMounts(env.python, sandboxOpts.root === 'host' || sandboxOpts.root === undefined ? 'host' : 'empty'),
      ...layers.flatMap((p) => (p.mount ? [p.mount] : [])),
      ...(sandboxOpts.mounts ?? []),
    ];
    const overlays = [...layers.flatMap((p) => (p.overlay ? [p.overlay] : [])), ...(sandboxOpts.overlays ?? [])];
    const sandbox = await Sandbox.create({
      ...sandboxOpts,
      capabilities,
      mounts,
      overlays,
      env: { ...venvVariables(venvPath), ...sandboxOpts.env },
      ...(sandboxOpts.cwd ?? repoPath ? { cwd: sandboxOpts.cwd ?? repoPath } : {}),
    });
    const setup: EnvSandboxSetup = {
      rewritten: { venv: placed.venv?.rewritten ?? [], repo: placed.repo?.rewritten ?? [] },
      totalMs: performance.now() - started,
    };
    return new EnvSandbox(sandbox, env, venvPath, repoPath, setup, scratch);
  } catch (err) {
    await (scratch as PrivateTree | undefined)?.remove().catch(() => undefined);
    if (err instanceof EnvError) throw err;
    throw new EnvError(`env ${env.id}: cannot start a sandbox${extract ? ' (extracted)' : ''}: ${(err as Error).message}`, { cause: err });
  }
}
