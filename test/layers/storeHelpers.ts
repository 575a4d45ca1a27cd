export { defaultStoreRoot, openStore, packDirectory } from '../../lib/layers/index.js';
export { walkTree as walkTreeForTest } from '../../lib/layers/fsTree.js';
