/** Options several commands share, declared once so that they read and explain themselves alike. */
import { defaultStoreRoot } from '../layers/index.js';
import { absolutePath, positiveInt, seconds, type OptionSpec } from './args.js';

export const STORE_OPTION: OptionSpec = { values: ['DIR'], check: absolutePath, default: defaultStoreRoot(), help: 'The layer store' };
export const JSON_OPTION: OptionSpec = { help: 'Print the result as JSON' };
export const JOBS_OPTION: OptionSpec = { values: ['N'], check: positiveInt, default: '2', help: 'Builds and test runs at once' };
export const TEST_TIMEOUT_OPTION: OptionSpec = { values: ['S'], check: seconds, default: '1800', help: 'Limit for one test run, in seconds' };
