/**
 * Container images, daemonless: `docker save` archives and OCI layouts
 * imported (or pulled from a registry) into the layer store, one layer per
 * diffID shared by every image that has it, and sandboxes made from them.
 */
export { ImageError } from './errors.js';
export {
  openImageStore,
  importImage,
  importLayout,
  listImages,
  findImage,
  getImage,
  imageLayers,
  removeImage,
  type ImageRecord,
  type ImportOptions,
  type ImportProgress,
  type LayoutImportOptions,
} from './images.js';
export { pullImage, type PullImageOptions } from './pull.js';
export { hostPlatform, type ImageConfig, type ImageRunConfig } from './read.js';
export { ownersMode, type Owners, type OwnersMode } from './owners.js';
export {
  createImageSandbox,
  runImage,
  imageCommand,
  imageProcessSettings,
  resolveImageUser,
  ImageSandbox,
  DOCKER_DEFAULT_PATH,
  type ImageSandboxOptions,
  type RunImageOptions,
  type ImageProcessSettings,
} from './sandbox.js';
export { pullToLayout, parseReference, formatReference, RegistryError, type PullOptions, type PullProgress, type PullResult, type ImageReference } from './registry.js';
