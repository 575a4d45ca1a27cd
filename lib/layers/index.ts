/**
 * Layer store: read-only environment layers (venvs, git checkouts) that
 * sandboxes mount as overlay lower directories.
 */
export { LayerError } from './errors.js';
export {
  openStore,
  defaultStoreRoot,
  normalizeDigest,
  digestDirectory,
  LayerStore,
  type Layer,
  type LayerManifest,
  type StoreOptions,
  type AddOptions,
  type ImageLayerSource,
  type DiskUsage,
  type GcOptions,
  type GcResult,
  type LayerCheck,
} from './store.js';
export type { Pin, PinOptions, PinRequest } from './pins.js';
export { describeProblem, type LayerProblem, type ListingEntry } from './verify.js';
export { IoBudget, type BudgetOptions, type BudgetTicket, type BudgetProgress, type BudgetUsage } from './budget.js';
export { dedupTree, gcObjects, type DedupOptions, type DedupResult } from './dedup.js';
export { normalizeTimes, LAYER_EPOCH, type NormalizeResult } from './times.js';
export {
  scanForPrefix,
  relocateTree,
  fixShebang,
  SHEBANG_LIMIT,
  type PrefixFile,
  type PrefixFileKind,
  type RelocateOptions,
  type RelocateResult,
} from './relocate.js';
