/**
 * The per-instance extraction baseline: each of an env's layer archives
 * unpacked, checked against its digest, into a private copy for one
 * sandbox, and bound read-write. It is the method MiniSandbox is measured
 * against (benchmarks/env.ts: seconds and the env's full size per sandbox,
 * where an overlay sandbox costs a few mounts), and not part of the API:
 * lib/env's index does not export it.
 */
import path from 'node:path';
import { IoBudget, type LayerStore } from '../layers/index.js';
import type { Env } from './manifest.js';
import { startEnvSandbox, type EnvSandbox, type EnvSandboxOptions } from './sandboxFromEnv.js';

export interface ExtractedEnvSandboxOptions extends Omit<EnvSandboxOptions, 'repo'> {
  /** Unpacking runs under this store's I/O budget (default: the budget in the env's store, <storeRoot>/budget). */
  store?: LayerStore;
}

/** A sandbox on `env` from private extracted copies of its layers, which close() removes. */
export function createExtractedEnvSandbox(env: Env, opts: ExtractedEnvSandboxOptions = {}): Promise<EnvSandbox> {
  const { store, ...rest } = opts;
  return startEnvSandbox(env, rest, { budget: store?.budget ?? new IoBudget({ dir: path.join(env.storeRoot, 'budget') }) });
}
