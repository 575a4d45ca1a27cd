/**
 * A small workload through the same contract as the real builder
 * (workload.ts): the demo task set (lib/swe/demo: four tiny pure-Python
 * repositories, one task each, offline), its venvs built once into a store
 * of its own, and SWE-bench-style Docker images of it (base: the host files
 * a MiniSandbox root shows plus the base interpreter; one env image per
 * venv; one instance image per task with the repository in /testbed).
 * For `--workload demo`: a first look in a minute, with no package index.
 */
import { mkdirSync, rmSync } from 'node:fs';
import { homedir } from 'node:os';
import path from 'node:path';
import { openStore } from '../../lib/layers/store.js';
import { createDemoTaskSet } from '../../lib/swe/demo/createDemoTaskSet.js';
import { prepareTasks } from '../../lib/swe/pipeline/prepare.js';
import { TESTBED } from '../../lib/swe/pipeline/types.js';
import { hostImagePaths, importImage } from '../lib/docker.js';
import { docker, findDocker, imageId } from './dockerCli.js';
import type { BuildWorkloadOptions, Workload, WorkloadDockerImages, WorkloadEnv } from './workload-types.js';

/** Bumped when the demo images change, so old ones are not reused. */
const DEMO_IMAGE_VERSION = 1;

export function defaultCacheDir(): string {
  return process.getuid?.() === 0 ? '/var/cache/minisandbox/bench-suite' : path.join(homedir(), '.cache', 'minisandbox', 'bench-suite');
}

/** Docker image names must be lower case, with a limited alphabet. */
export function imageTag(s: string): string {
  return s.toLowerCase().replace(/[^a-z0-9_.-]/g, '-');
}

export async function buildDemoWorkload(opts: Omit<BuildWorkloadOptions, 'size'>): Promise<Workload> {
  const log = opts.onProgress ?? (() => undefined);
  const dir = path.join(opts.cacheDir ?? defaultCacheDir(), 'demo');
  mkdirSync(dir, { recursive: true });
  // The demo set is generated, deterministic and small: made afresh each
  // time (its commits are fixed, so the store's layers are reused).
  const setDir = path.join(dir, 'taskset');
  rmSync(setDir, { recursive: true, force: true });
  const demo = createDemoTaskSet(setDir);
  const envs: WorkloadEnv[] = demo.tasks.map((t) => ({ key: `${t.repo.split('/').pop()}-${t.version}`, repo: t.repo.split('/').pop()!, version: t.version, python: t.python!, tasks: [t.instance_id] }));
  const workload: Workload = {
    size: 'quick',
    dir,
    tasksFile: demo.tasksFile,
    tasks: demo.tasks,
    goldPredictionsFile: demo.goldPredictionsFile,
    reposDir: path.join(setDir, 'repos'),
    envs,
  };
  if (!opts.docker) {
    workload.dockerSkipped = 'not asked for (--no-docker)';
    return workload;
  }
  const d = await findDocker();
  if ('missing' in d) {
    workload.dockerSkipped = d.missing;
    return workload;
  }
  // The images hold the venvs and repositories MiniSandbox builds (the
  // same bytes on both sides), from a store of the workload's own.
  log('demo workload: building its venvs and repositories');
  const store = await openStore({ root: path.join(dir, 'store') });
  const prep = await prepareTasks(demo.tasks, { store, ...(opts.signal ? { signal: opts.signal } : {}) });
  if (prep.failures.length) throw new Error(`demo workload: ${prep.failures.map((f) => f.message).join('; ')}`);
  const first = prep.prepared.values().next().value!;
  const python = first.env!.python;
  const base = `msbx-suite/demo-base:${DEMO_IMAGE_VERSION}`;
  await importImage({ cli: d.cli, hostArgs: [], serverVersion: d.serverVersion, startedByUs: false }, base, [...hostImagePaths(), python.prefix.slice(1)], log);
  const images: WorkloadDockerImages = { base, envs: {}, instances: {} };
  const build = async (tag: string, from: string, context: string, target: string, env: string[] = []) => {
    if (await imageId(d, tag)) return;
    log(`demo workload: docker build ${tag}`);
    const dockerfile = [`FROM ${from}`, `COPY . ${target}`, ...env, `WORKDIR ${TESTBED}`, ''].join('\n');
    // The store's layers are read-only trees; a Dockerfile beside them is
    // not possible, so it comes on stdin.
    await docker(d, ['build', '-q', '-t', tag, '-f', '-', context], { input: dockerfile, timeoutMs: 600_000 });
  };
  for (const task of demo.tasks) {
    const p = prep.prepared.get(task.instance_id)!;
    const envKey = envs.find((e) => e.tasks.includes(task.instance_id))!.key;
    const venv = await store.get(p.env!.venvDigest);
    const repo = await store.get(p.env!.repoDigest);
    if (!venv || !repo) throw new Error(`demo workload: ${task.instance_id}: layers missing from ${store.root}`);
    const envImage = `msbx-suite/demo-env:${imageTag(envKey)}-${p.env!.venvDigest.slice(0, 12)}`;
    await build(envImage, base, venv.path, p.env!.venvPath, [`ENV PATH=${p.env!.venvPath}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin VIRTUAL_ENV=${p.env!.venvPath} PYTHONNOUSERSITE=1 LANG=C.UTF-8 HOME=/root`]);
    const instImage = `msbx-suite/demo-instance:${imageTag(task.instance_id)}-${p.env!.repoDigest.slice(0, 12)}`;
    await build(instImage, envImage, repo.path, TESTBED);
    images.envs[envKey] = envImage;
    images.instances[task.instance_id] = instImage;
  }
  workload.docker = images;
  return workload;
}

