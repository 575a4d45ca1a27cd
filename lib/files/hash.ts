import { createHash } from 'node:crypto';
import { createReadStream, promises as fsp } from 'node:fs';
import { codeOf } from '../errors.js';

export function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** sha256 of a file's content, hex. `knownSize` (from a stat already made) picks the faster way to read it. */
export async function hashFile(file: string, knownSize?: number): Promise<string> {
  // Small files (most of a venv): one read beats a stream's setup cost.
  if (knownSize !== undefined && knownSize <= 1 << 20) return sha256Hex(await fsp.readFile(file));
  const h = createHash('sha256');
  await new Promise<void>((resolve, reject) => {
    createReadStream(file, { highWaterMark: 1 << 20 })
      .on('data', (b) => h.update(b))
      .on('end', () => resolve())
      .on('error', reject);
  });
  return h.digest('hex');
}

/** sha256 of a file, streamed; undefined if it does not exist. */
export async function fileSha256(file: string): Promise<string | undefined> {
  try {
    const st = await fsp.stat(file);
    return await hashFile(file, st.size);
  } catch (err) {
    if (codeOf(err) === 'ENOENT') return undefined;
    throw err;
  }
}
