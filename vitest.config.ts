import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Sandboxes are real processes with real mounts; forks keep each test
    // file in its own Node process so a crash cannot take the runner down.
    pool: 'forks',
  },
});
