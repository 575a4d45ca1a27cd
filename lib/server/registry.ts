/**
 * The sandboxes a server owns: created on request (or lazily, for the
 * default one served at the root paths), each with its named shell
 * sessions, counted against a maximum, closed on DELETE or server stop.
 */
import { createImageSandbox, openImageStore } from '../images/index.js';
import { Sandbox, policy, type SandboxCreateOptions } from '../sandbox/index.js';
import { SessionDoesNotExistError, type ShellSession } from '../shell/index.js';
import { HttpError } from './http.js';
import { pyRepr } from './python.js';

/** One sandbox and the SWE-ReX sessions opened in it (the sandbox's own named sessions). */
export class ManagedSandbox {
  readonly created = new Date();

  constructor(
    readonly sandbox: Sandbox,
    readonly isDefault: boolean,
    /** The image the sandbox was made from, as the request named it. */
    readonly image?: string,
    /** What closing takes besides the sandbox (an image sandbox's hold on its layers). */
    private readonly closeSandbox: () => Promise<void> = () => sandbox.close(),
  ) {}

  get id(): string {
    return this.sandbox.id;
  }

  /** The named session, or SWE-ReX's SessionDoesNotExistError. */
  session(name: string): ShellSession {
    const s = this.sandbox.session(name);
    if (!s) throw noSuchSession(name);
    return s;
  }

  async closeSession(name: string): Promise<void> {
    if (!(await this.sandbox.closeSession(name))) throw noSuchSession(name);
  }

  /** POST /close: every session ends; the sandbox and its files stay. */
  async closeAllSessions(): Promise<void> {
    await Promise.all(this.sandbox.sessionNames.map((name) => this.sandbox.closeSession(name)));
  }

  async close(): Promise<void> {
    await this.closeAllSessions().catch(() => {});
    await this.closeSandbox();
  }

  describe(baseUrl: string): Record<string, unknown> {
    return {
      id: this.id,
      url: `${baseUrl}/sandboxes/${this.id}`,
      default: this.isDefault,
      ...(this.image !== undefined ? { image: this.image } : {}),
      hostname: this.sandbox.hostname,
      created: this.created.toISOString(),
      alive: !this.sandbox.closed,
      sessions: this.sandbox.sessionNames,
      limits: this.sandbox.limits,
    };
  }
}

function noSuchSession(name: string): SessionDoesNotExistError {
  return new SessionDoesNotExistError(`session ${pyRepr(name)} does not exist`);
}

export interface RegistryOptions {
  /** Most sandboxes alive at once, the default one included. Default: no limit. */
  maxSandboxes?: number;
  /** Options every sandbox starts from; a request's fields override them. */
  sandboxDefaults?: SandboxCreateOptions;
  /** Injectable for tests; default Sandbox.create. */
  createSandbox?: (opts: SandboxCreateOptions) => Promise<Sandbox>;
  /** The layer store whose images POST /sandboxes may name (default: the default store). */
  imageStore?: string;
  /**
   * Asked before every creation (a cluster counts the sandbox), with the
   * token of the slot a placement reserved for it, or undefined (the
   * default sandbox: a slot must be free). Returns how to give the slot
   * back if the creation fails, or throws the HttpError to answer.
   */
  admit?: (slotToken: string | undefined) => Promise<() => Promise<void>>;
  /** Told once a sandbox is registered (a cluster records where it lives), before its creator hears of it. */
  onAdded?: (m: ManagedSandbox) => Promise<void>;
  /** Told once a sandbox was deleted (a cluster frees its slot). */
  onRemoved?: (m: ManagedSandbox) => Promise<void>;
}

type ImageStore = Awaited<ReturnType<typeof openImageStore>>;

export class SandboxRegistry {
  readonly #byId = new Map<string, ManagedSandbox>();
  /** Creations in flight count against the maximum too. */
  #pending = 0;
  #default: Promise<ManagedSandbox> | null = null;
  #closed = false;
  readonly #create: (opts: SandboxCreateOptions) => Promise<Sandbox>;
  #imageStore: Promise<ImageStore> | undefined;

  constructor(private readonly options: RegistryOptions = {}) {
    this.#create = options.createSandbox ?? ((o) => Sandbox.create(o));
  }

  get size(): number {
    return this.#byId.size;
  }

  /** Sandboxes being created now (they hold a slot already). */
  get pending(): number {
    return this.#pending;
  }

  list(): ManagedSandbox[] {
    return [...this.#byId.values()];
  }

  get(id: string): ManagedSandbox {
    const m = this.#byId.get(id);
    if (!m) throw HttpError.detail(404, `no sandbox with id ${JSON.stringify(id)}`);
    return m;
  }

  /** `slotToken`: the slot a cluster's placement reserved for this sandbox. */
  async create(request: SandboxCreateOptions & { image?: string } = {}, isDefault = false, slotToken?: string): Promise<ManagedSandbox> {
    if (this.#closed) throw HttpError.detail(503, 'server is shutting down');
    const max = this.options.maxSandboxes;
    if (max !== undefined && this.#byId.size + this.#pending >= max) {
      throw HttpError.detail(429, `sandbox limit reached: ${max} sandboxes are in use; DELETE /sandboxes/<id> one first`, {
        'retry-after': '1',
      });
    }
    this.#pending++;
    let managed: ManagedSandbox;
    let release: (() => Promise<void>) | undefined;
    try {
      if (this.options.admit) release = await this.options.admit(slotToken);
      const defaults = this.options.sandboxDefaults ?? {};
      const { image, ...rest } = request;
      const opts: SandboxCreateOptions = {
        ...defaults,
        ...rest,
        env: { ...defaults.env, ...rest.env },
        limits: { ...defaults.limits, ...rest.limits },
      };
      managed = image === undefined ? new ManagedSandbox(await this.#create(opts), isDefault) : await this.#createFromImage(image, opts, isDefault);
    } catch (e) {
      await release?.().catch(() => {});
      throw e;
    } finally {
      this.#pending--;
    }
    if (this.#closed) {
      await managed.close();
      throw HttpError.detail(503, 'server is shutting down');
    }
    this.#byId.set(managed.id, managed);
    if (this.options.onAdded) {
      try {
        await this.options.onAdded(managed);
      } catch (e) {
        // Unrecorded, the sandbox could not be found from other nodes: undo it whole.
        await this.delete(managed.id).catch(() => {});
        throw e;
      }
    }
    return managed;
  }

  /**
   * A sandbox whose root is an image of the store, with the image's Env and
   * working directory; the request's env, limits and network apply on top.
   * Commands and sessions run as root, as SWE-ReX's own server does in a
   * container, whatever the image's USER.
   */
  async #createFromImage(image: string, opts: SandboxCreateOptions, isDefault: boolean): Promise<ManagedSandbox> {
    const { env, root: _root, cwd: _cwd, ...rest } = opts;
    this.#imageStore ??= openImageStore(this.options.imageStore ? { root: this.options.imageStore } : {});
    // Root that may edit any file of its image, as root in a container can (copy-up).
    const capabilities = rest.capabilities ?? policy.FILE_CAPABILITIES;
    const isb = await createImageSandbox(await this.#imageStore, image, { ...rest, capabilities, ...(env ? { env } : {}), user: 'root' });
    return new ManagedSandbox(isb.sandbox, isDefault, image, () => isb.close());
  }

  /**
   * The sandbox behind the root paths, created by the first request that
   * needs it (so a server used only through /sandboxes/<id> holds none),
   * and again after it was deleted.
   */
  default(): Promise<ManagedSandbox> {
    this.#default ??= this.create({}, true).catch((e: unknown) => {
      this.#default = null; // let a later request try again
      throw e;
    });
    return this.#default;
  }

  async delete(id: string): Promise<void> {
    const m = this.get(id);
    this.#byId.delete(id);
    if (m.isDefault) this.#default = null;
    try {
      await m.close();
    } finally {
      await this.options.onRemoved?.(m);
    }
  }

  async closeAll(): Promise<void> {
    this.#closed = true;
    const all = [...this.#byId.values()];
    this.#byId.clear();
    this.#default = null;
    await Promise.all(all.map((m) => m.close().catch(() => {})));
  }
}
