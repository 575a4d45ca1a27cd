/**
 * Host-side scratch space for one env sandbox, used when its layers need
 * work before the sandbox starts (extraction, relocation): Sandbox.create
 * makes the sandbox's own private dir only while it starts, too late for
 * that. So we make a sibling with the same conventions: under the same
 * state dir, named `sbx-…` with an owner record, so the sandbox module's
 * garbage collection removes it if this process dies before close().
 */
import { removeTree } from '../files/fsTree.js';
import { createPrivateDir, defaultStateDir, ensureStateDir, randomHex12 } from '../sandbox/state.js';

export interface PrivateTree {
  dir: string;
  remove(): Promise<void>;
}

export function createPrivateTree(stateDir: string | undefined): PrivateTree {
  const root = stateDir ?? defaultStateDir();
  ensureStateDir(root);
  const dir = createPrivateDir(root, `sbx-env${randomHex12()}`);
  return { dir, remove: () => removeTree(dir) };
}
