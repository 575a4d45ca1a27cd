/**
 * The one place lib/swe meets lib/images: a task's image brought into the
 * store (imported from a file, found by name, or pulled), and a sandbox
 * whose root is that image, with the task's repository layer over repoDir.
 * Everything else of the pipeline sees a TaskSandbox, as for a venv task.
 *
 * lib/images is written alongside (branch i11-core); until this build has
 * it, an image task under sandbox isolation fails at prepare with the
 * reason, and `isolation: 'docker'` is the way to run images.
 */
import type { LayerStore } from '../../layers/store.js';
import type { Limits } from '../../sandbox/limits.js';
import { SweError } from '../errors.js';
import type { TaskSandbox } from './types.js';

/** Why this build cannot run sandboxes from images, or undefined when it can. */
export function imageSandboxUnavailable(): string | undefined {
  return 'sandboxes from images need lib/images, which this build does not include yet (run the task with isolation "docker")';
}

/**
 * The image in the store, by its id (the config digest): an archive file is
 * imported, a name the store knows is taken as it is, any other reference
 * is pulled. `fetched` says whether anything was imported or pulled.
 */
export async function ensureStoreImage(_store: LayerStore, image: string, _file: boolean): Promise<{ id: string; fetched: boolean }> {
  const why = imageSandboxUnavailable();
  throw new SweError(`image ${image}: ${why}`);
}

export interface ImageSandboxOptions {
  store: LayerStore;
  /** The store's image id (ensureStoreImage). */
  imageId: string;
  instanceId: string;
  repoDir: string;
  /** A repository layer to mount at repoDir, over what the image has there. */
  repoLayerPath?: string;
  stateDir?: string;
  limits?: Limits;
}

export async function createImageTaskSandbox(o: ImageSandboxOptions): Promise<TaskSandbox> {
  throw new SweError(`task ${o.instanceId}: ${imageSandboxUnavailable()}`);
}
