/**
 * Pins: which layers are in use, and by whom, recorded in the store so that
 * `gc` needs nobody to tell it (as Git's refs and Nix's GC roots are).
 *
 * One file per owner, `pins/<sha256 of owner>.json` (an owner is any
 * string: "env env-…", "swe repo …"), written whole and renamed into place,
 * so a reader never sees half a pin. Every change happens under
 * `locks/pins.lock`; a pin that names layers is written while their build
 * locks are held too (store.ts), so pinning and `gc` never cross: a layer is
 * either pinned before gc looks, or removed before the pin is written and
 * the pin fails, naming it.
 *
 * A pin made `whileAlive` records its process (pid and start time) and
 * counts only while that process lives: for work in progress (a build whose
 * owner name is not known yet), which a crash must not pin forever. gc
 * deletes such pins once their process is gone.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { adopt, codeOf } from '../errors.js';
import { sha256Hex } from '../files/hash.js';
import { withLock } from '../files/lock.js';
import { processIsAlive } from '../files/proc.js';
import { LayerError } from './errors.js';

export interface Pin {
  /** Who uses the layers: one pin per owner. */
  owner: string;
  /** What people see (`minisandbox store ls`). */
  label: string;
  /** The layers it keeps, sorted. */
  digests: string[];
  /** ISO time of its last change. */
  updated: string;
  /** Set for a pin that counts only while this process lives. */
  process?: { pid: number; startTime: string };
}

export interface PinOptions {
  /** What people see (`minisandbox store ls`); default: the owner. */
  label?: string;
  /** Count only while this process lives: for work in progress, which a crash must not pin forever. */
  whileAlive?: boolean;
}

/** A pin to add a layer to: its owner, with the options for a pin made anew. */
export type PinRequest = string | ({ owner: string } & PinOptions);

export function checkOwner(owner: unknown): string {
  if (typeof owner !== 'string' || owner.trim() === '' || owner.includes('\0'))
    throw new LayerError(`pin owner ${JSON.stringify(owner)}: must be a non-empty string`);
  return owner;
}

/** A PinRequest as owner and options, the owner checked. */
export function pinRequest(req: PinRequest): { owner: string } & PinOptions {
  const pin = typeof req === 'string' ? { owner: req } : req;
  checkOwner(pin.owner);
  return pin;
}

function pinFile(root: string, owner: string): string {
  return path.join(root, 'pins', `${sha256Hex(owner)}.json`);
}

export function isLive(pin: Pin): boolean {
  return pin.process === undefined || processIsAlive(pin.process.pid, pin.process.startTime);
}

/** Every change to pins is made under this lock. */
export function withPinsLock<T>(root: string, fn: () => Promise<T>): Promise<T> {
  return withLock(path.join(root, 'locks', 'pins.lock'), fn, { what: `pins of the store ${root}` }).catch((err: unknown) => {
    throw adopt(err, LayerError);
  });
}

async function readPinFile(file: string): Promise<Pin | undefined> {
  let text: string;
  try {
    text = await fsp.readFile(file, 'utf8');
  } catch (err) {
    if (codeOf(err) === 'ENOENT') return undefined;
    throw err;
  }
  try {
    const pin = JSON.parse(text) as Pin;
    if (typeof pin.owner === 'string' && Array.isArray(pin.digests)) return pin;
  } catch {
    // not ours: a stray file is no pin
  }
  return undefined;
}

export function readPin(root: string, owner: string): Promise<Pin | undefined> {
  return readPinFile(pinFile(root, owner));
}

/** Every pin in the store, live or not, with its file. */
export async function readPins(root: string): Promise<{ file: string; pin: Pin }[]> {
  const dir = path.join(root, 'pins');
  const out: { file: string; pin: Pin }[] = [];
  for (const name of (await fsp.readdir(dir)).sort()) {
    if (!/^[0-9a-f]{64}\.json$/.test(name)) continue;
    const pin = await readPinFile(path.join(dir, name));
    if (pin) out.push({ file: path.join(dir, name), pin });
  }
  return out;
}

/** Write (under the pins lock). */
export async function writePin(root: string, pin: Pin): Promise<void> {
  const file = pinFile(root, pin.owner);
  const tmp = `${file}.tmp-${process.pid}`;
  await fsp.writeFile(tmp, `${JSON.stringify(pin, null, 2)}\n`);
  await fsp.rename(tmp, file);
}

/** Remove (under the pins lock); false if there was none. */
export async function removePin(root: string, owner: string): Promise<boolean> {
  try {
    await fsp.unlink(pinFile(root, owner));
    return true;
  } catch (err) {
    if (codeOf(err) === 'ENOENT') return false;
    throw err;
  }
}
