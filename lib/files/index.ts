/**
 * The file utilities every other room uses, and that know nothing of
 * sandboxes, layers or environments: checked archive extraction and
 * reproducible packing, cross-process locks, tree walks and removal,
 * hashing, child processes, and the concurrency limiter.
 */
export { FileError } from './errors.js';
export {
  extractArchive,
  extractUntrusted,
  extractImageLayer,
  packDirectory,
  compressionOf,
  type Compression,
  type ExtractOptions,
  type ExtractResult,
  type ArchiveExtractResult,
  type UntrustedExtractOptions,
  type ImageLayerExtractOptions,
  type ImageLayerExtractResult,
  type TarSpawner,
  type PackOptions,
} from './extract.js';
export { stopUnpackWorkers, type FileDigest } from './unpack.js';
export { acquireLock, withLock, type FileLock, type LockOptions } from './lock.js';
export { removeTree } from './fsTree.js';
export { createLimiter, type Limiter } from './limit.js';
