/**
 * The one place lib/swe meets lib/images: a task's image brought into the
 * store (imported from a file, found by name, or pulled), and a sandbox
 * whose root is that image, with the task's repository layer over repoDir.
 * Everything else of the pipeline sees a TaskSandbox, as for a venv task.
 *
 * lib/images loads lib/sandbox (the addon): it is imported on first use,
 * so that lib/swe's parsers and grader still load where the addon cannot.
 */
import { mkdir, mkdtemp } from 'node:fs/promises';
import { join } from 'node:path';
import { removeTree } from '../../files/fsTree.js';
import type { LayerStore } from '../../layers/store.js';
import type { Limits } from '../../sandbox/limits.js';
import { adopt } from '../../errors.js';
import { SweError } from '../errors.js';
import { dockerImageId, dockerSave } from './docker.js';
import type { TaskSandbox } from './types.js';

let library: Promise<typeof import('../../images/index.js')> | undefined;
const images = () => (library ??= import('../../images/index.js'));

/** A registry on this machine: Docker itself talks plain HTTP to one (its default insecure registries). */
function isLoopbackRegistry(host: string): boolean {
  const h = host.replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127(\.\d{1,3}){3}$/.test(h);
}

/**
 * The image in the store, by its id (the config digest): an archive file is
 * imported (layers the store has are not unpacked again); a name the store
 * knows is taken as it is; a name Docker's engine has is imported from it
 * (`docker save`: the same bytes as `docker run` uses, and no network);
 * any other reference is pulled. `fetched` says whether anything was
 * imported or pulled.
 */
export async function ensureStoreImage(store: LayerStore, image: string, file: boolean, signal?: AbortSignal): Promise<{ id: string; fetched: boolean }> {
  const lib = await images();
  try {
    if (file) {
      const [first] = await lib.importImage(store, image, signal ? { signal } : {});
      if (!first) throw new SweError(`image ${image}: the archive holds no image`);
      return { id: first.id, fetched: true };
    }
    const found = await lib.findImage(store, image);
    if (found) return { id: found.id, fetched: false };
    if ((await dockerImageId(image)) !== undefined) {
      // In the store's staging area: on the store's disk (an image can be
      // gigabytes), where the store's own scratch files go.
      await mkdir(join(store.root, 'staging'), { recursive: true });
      const dir = await mkdtemp(join(store.root, 'staging', 'swe-docker-save-'));
      try {
        await dockerSave(image, join(dir, 'image.tar'));
        const [first] = await lib.importImage(store, join(dir, 'image.tar'), { names: [image], ...(signal ? { signal } : {}) });
        if (!first) throw new SweError(`image ${image}: docker save gave no image`);
        return { id: first.id, fetched: true };
      } finally {
        await removeTree(dir).catch(() => undefined);
      }
    }
    const insecure = isLoopbackRegistry(lib.parseReference(image).registry);
    const pulled = await lib.pullImage(store, image, { ...(insecure ? { insecure } : {}), ...(signal ? { signal } : {}) });
    return { id: pulled.id, fetched: true };
  } catch (err) {
    if (err instanceof SweError) throw err;
    throw new SweError(`image ${image}: ${(err as Error).message}`, { cause: err });
  }
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

/**
 * A sandbox of the image as SWE-bench's harness runs its containers: as
 * root (whatever the image's USER), with root's file capabilities (the
 * repository layer is read-only in the store, and the tests and `git
 * apply` write over it, as Docker's root can), no network, the image's Env.
 */
export async function createImageTaskSandbox(o: ImageSandboxOptions): Promise<TaskSandbox> {
  const lib = await images();
  try {
    const sb = await lib.createImageSandbox(o.store, o.imageId, {
      user: '0:0',
      workdir: o.repoDir,
      ...(o.repoLayerPath ? { overlays: [{ target: o.repoDir, lower: [o.repoLayerPath] }] } : {}),
      ...(o.stateDir ? { stateDir: o.stateDir } : {}),
      ...(o.limits ? { limits: o.limits } : {}),
    });
    return { exec: (cmd, opts) => sb.exec(cmd, opts), close: () => sb.close() };
  } catch (err) {
    throw adopt(err, SweError);
  }
}
