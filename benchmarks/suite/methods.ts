/**
 * The four ways the suite runs one task's environment, behind one interface:
 * start an instance (from nothing running to the first command done), run
 * commands in it (a one-shot exec, or a step of a persistent shell as an
 * agent makes), close it.
 *
 * - docker:  `docker run -d` of the task's SWE-bench-style instance image,
 *            `docker exec` per command (SWE-bench's harness, SWE-agent's
 *            docker deployment);
 * - extract: the paper's method: the venv's and the repository's archives
 *            unpacked into a private copy per instance, under the store's
 *            I/O budget, bound read-write (lib/env's extraction baseline,
 *            with the task's own repository layer: lib/env's refuses a
 *            repo layer other than the env's, so the suite places both
 *            itself with the same pieces: extractArchive, IoBudget);
 * - layers:  MiniSandbox's default: the shared venv and repo layers stacked
 *            by overlay with a private writable layer (createEnvSandbox);
 * - image:   MiniSandbox running the task's Docker instance image, imported
 *            into its store (createImageSandbox).
 * For the sandboxes, `step` is `session.run` in one bash session (the
 * agent's shell); for Docker it is a `docker exec`, what Docker-based
 * agents do per step.
 */
import { mkdirSync } from 'node:fs';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { basePythonMounts, createEnvSandbox, loadEnv, venvVariables, type Env } from '../../lib/env/index.js';
import { extractArchive, packDirectory } from '../../lib/files/extract.js';
import { removeTree } from '../../lib/files/fsTree.js';
import { createImageSandbox } from '../../lib/images/index.js';
import { IoBudget, type Layer, type LayerStore } from '../../lib/layers/index.js';
import { Sandbox, policy } from '../../lib/sandbox/index.js';
import type { ShellSession } from '../../lib/shell/index.js';
import { TESTBED, type PreparedTask } from '../../lib/swe/pipeline/types.js';
import { docker, SUITE_LABEL, SUITE_NAME, type DockerCli } from './dockerCli.js';

export const METHODS = ['docker', 'extract', 'layers', 'image'] as const;
export type MethodName = (typeof METHODS)[number];

export interface CommandResult {
  stdout: string;
  exitCode: number | null;
}

export interface Instance {
  /** A one-shot command (sandbox exec, docker exec), run by bash in the repository. */
  exec(cmd: string): Promise<CommandResult>;
  /** A step of the agent's shell (session.run; docker exec for Docker). */
  step(cmd: string): Promise<CommandResult>;
  close(): Promise<void>;
  /** Where this instance's private files are on the host (du), or a container id for Docker. */
  privateDir?: string;
  containerId?: string;
}

export interface Method {
  name: MethodName;
  /** Starts an instance of the task and runs its first command (`true`). */
  start(instanceId: string): Promise<Instance>;
}

/** Store layers are read-only (0444/0555): root in the sandbox must write over them, as root in a container can. */
const CAPABILITIES = [...policy.FILE_CAPABILITIES, 'CAP_FSETID'];
const STEP_TIMEOUT_MS = 300_000;

/** Every live instance, so that an interrupt can close them all. */
export const liveInstances = new Set<Instance>();

function track(inst: Instance): Instance {
  liveInstances.add(inst);
  const close = inst.close.bind(inst);
  inst.close = async () => {
    liveInstances.delete(inst);
    await close();
  };
  return inst;
}

/** A sandbox instance: exec by `bash -c`, steps in one bash session opened on first use. */
function sandboxInstance(sb: Sandbox, close: () => Promise<void>, privateDir?: string): Instance {
  let shell: Promise<ShellSession> | undefined;
  return {
    exec: async (cmd) => {
      const r = await sb.exec(['bash', '-c', cmd], { timeout: STEP_TIMEOUT_MS });
      return { stdout: r.stdout, exitCode: r.exitCode };
    },
    step: async (cmd) => {
      shell ??= sb.shell({ cwd: TESTBED });
      const r = await (await shell).run(cmd, { check: 'silent', timeoutMs: STEP_TIMEOUT_MS });
      return { stdout: r.output, exitCode: r.exitCode };
    },
    close,
    ...(privateDir ? { privateDir } : {}),
  };
}

async function firstCommand(inst: Instance): Promise<Instance> {
  try {
    const r = await inst.exec('true');
    if (r.exitCode !== 0) throw new Error(`first command exited ${r.exitCode}`);
    return inst;
  } catch (err) {
    await inst.close().catch(() => undefined);
    throw err;
  }
}

let containerSeq = 0;

export function dockerMethod(d: DockerCli, images: Record<string, string>): Method {
  return {
    name: 'docker',
    async start(instanceId) {
      const image = images[instanceId];
      if (!image) throw new Error(`docker: no instance image for ${instanceId}`);
      const name = `${SUITE_NAME}-${process.pid}-${++containerSeq}`;
      // Registered before the run: an interrupt during `docker run` still
      // finds it by its label.
      const id = (await docker(d, ['run', '-d', '--name', name, '--label', SUITE_LABEL, '--network', 'none', '-w', TESTBED, image, 'sleep', 'infinity'], { timeoutMs: 600_000 })).stdout.trim();
      const exec = async (cmd: string) => {
        const r = await docker(d, ['exec', id, 'bash', '-c', cmd], { allowFail: true, timeoutMs: STEP_TIMEOUT_MS });
        if (r.code === 125 || r.code === 126) throw new Error(`docker exec in ${name}: ${r.stderr.trim()}`);
        return { stdout: r.stdout, exitCode: r.code };
      };
      const inst: Instance = { exec, step: exec, close: async () => void (await docker(d, ['rm', '-f', id], { allowFail: true, timeoutMs: 120_000 })), containerId: id };
      return firstCommand(track(inst));
    },
  };
}

/** What the MiniSandbox methods need of a prepared task: its env and its repository layer. */
export interface TaskLayers {
  env: Env;
  repo: Layer;
}

export async function taskLayers(store: LayerStore, p: PreparedTask): Promise<TaskLayers> {
  if (!p.env) throw new Error(`${p.instance_id}: not a venv task`);
  const env = await loadEnv(p.env.envId, { store });
  const repo = await store.get(p.env.repoDigest);
  if (!repo) throw new Error(`${p.instance_id}: repo layer ${p.env.repoDigest} not in ${store.root}`);
  return { env, repo };
}

export function layersMethod(tasks: Map<string, TaskLayers>, stateDir: string): Method {
  return {
    name: 'layers',
    async start(instanceId) {
      const t = tasks.get(instanceId);
      if (!t) throw new Error(`layers: task ${instanceId} not prepared`);
      const sb = await createEnvSandbox(t.env, { repo: t.repo, capabilities: CAPABILITIES, stateDir });
      return firstCommand(track(sandboxInstance(sb.sandbox, () => sb.close())));
    },
  };
}

/** Packs a layer's tree into `<dir>/<digest>.tar.zst` once: the shipped form the extract method unpacks. */
export async function layerArchive(layer: Layer, dir: string): Promise<string> {
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${layer.digest.replace(/^sha256:/, '')}.tar.zst`);
  if (!(await fsp.stat(file).catch(() => undefined))) await packDirectory(layer.path, file, { compression: 'zstd' });
  return file;
}

export function extractMethod(tasks: Map<string, TaskLayers & { venvArchive: string; repoArchive: string }>, stateDir: string, budget: IoBudget): Method {
  let seq = 0;
  return {
    name: 'extract',
    async start(instanceId) {
      const t = tasks.get(instanceId);
      if (!t) throw new Error(`extract: task ${instanceId} not prepared`);
      const dir = path.join(stateDir, `extract-${process.pid}-${++seq}`);
      // removeTree: the unpacked trees have read-only dirs (the store's modes), which rm -rf cannot empty as a non-root user.
      const remove = () => removeTree(dir);
      try {
        await fsp.mkdir(dir, { recursive: true });
        const unpack = async (archive: string, dest: string) => {
          const ticket = await budget.acquire((await fsp.stat(archive)).size, { label: `extract ${path.basename(archive)}` });
          try {
            await fsp.mkdir(dest);
            await extractArchive(archive, dest, { onProgress: (done) => ticket.progress(done) });
          } finally {
            await ticket.release();
          }
        };
        const venv = path.join(dir, 'venv');
        const repo = path.join(dir, 'repo');
        await Promise.all([unpack(t.venvArchive, venv), unpack(t.repoArchive, repo)]);
        const sb = await Sandbox.create({
          capabilities: CAPABILITIES,
          stateDir,
          mounts: [...basePythonMounts(t.env.python), { type: 'bind', source: venv, target: t.env.venvPath }, { type: 'bind', source: repo, target: TESTBED }],
          env: venvVariables(t.env.venvPath),
          cwd: TESTBED,
        });
        return await firstCommand(track(sandboxInstance(sb, async () => {
          await sb.close();
          await remove();
        }, dir)));
      } catch (err) {
        await remove();
        throw err;
      }
    },
  };
}

export function imageMethod(store: LayerStore, imageIds: Map<string, string>, stateDir: string): Method {
  return {
    name: 'image',
    async start(instanceId) {
      const id = imageIds.get(instanceId);
      if (!id) throw new Error(`image: no imported image for ${instanceId}`);
      const sb = await createImageSandbox(store, id, { user: '0:0', workdir: TESTBED, capabilities: CAPABILITIES, stateDir });
      return firstCommand(track(sandboxInstance(sb.sandbox, () => sb.close())));
    },
  };
}

