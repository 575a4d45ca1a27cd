import { Transform, type TransformCallback } from 'node:stream';
import { FileError } from './errors.js';

/**
 * Streaming tar header checker.
 *
 * Why not `tar -tvv` and parse its listing: the listing is meant for people.
 * Names may contain " -> " or newlines, and the date and owner columns differ by
 * locale and version. So the listing is ambiguous exactly where an attacker has
 * control. Instead this Transform reads the raw tar stream (ustar, GNU longname
 * 'L'/'K', and pax 'x' records) the way GNU tar reads it. It checks each member
 * *before* passing that member's header on to `tar -x`. tar therefore never sees
 * a member that was refused, and we decompress only once.
 *
 * Rules (everything else is refused too, with the member and the reason):
 *  - no absolute names, no `..` component (names and hard link targets);
 *  - no member whose parent path is an earlier symlink member. This blocks the
 *    trick of a symlink `a -> /etc` followed by a file `a/passwd`;
 *  - no non-symlink member replacing an earlier symlink member, and no symlink
 *    replacing a directory (one named by a member or implied by a member's path);
 *  - no member whose parent path is an earlier file member (tar would fail with
 *    ENOTDIR half-way; refusing says why);
 *  - a hard link must point at an earlier *regular file* member of the same
 *    archive, so it can never reach a file outside the tree. Not at a symlink:
 *    link(2) would make a second name for the symlink, which this checker
 *    would then count as a file, and a later `h/x` would be written through
 *    it (GNU tar follows an in-tree one; only its placeholder trick stops an
 *    absolute one). Not at itself;
 *  - no member replacing a hard link or the target of one: the shared inode
 *    would be written through unless tar unlinks first (GNU tar's default
 *    does, `--overwrite` does not), and we do not depend on tar's options;
 *  - only regular files, hard links, symlinks and directories. No devices,
 *    FIFOs or sparse/multivolume members;
 *  - header checksums must be valid. On a bad checksum GNU tar would scan ahead
 *    for the next plausible header, and then the two parsers would disagree.
 *
 * Symlink targets, with `symlinks: 'anywhere'` (layers, the default), may be
 * anything, absolute ones included (a venv's bin/python3 points at the base
 * interpreter). Nothing in the archive may be extracted through a symlink, so
 * the target only matters later, inside the sandbox's own mount namespace.
 * With `symlinks: 'inside'` (a tree handed to the host, e.g. a download out of
 * a sandbox) every symlink must resolve inside the destination: absolute
 * targets are refused, and relative ones are resolved the way the kernel would,
 * through the archive's other symlinks, and refused if any step climbs above
 * the destination. A later symlink can change how an earlier one resolves, so
 * every symlink is checked again at the end of the archive, before tar sees
 * the end-of-archive blocks.
 *
 * Setuid and setgid bits are cleared in every header passed on (the checksum
 * is recomputed): no layer needs them (the store strips them anyway), and a
 * tree unpacked by root must never carry a setuid-root binary onto the host.
 */
export interface TarCheckOptions {
  /** What messages start with (default `layer archive <archiveName>`). */
  label?: string;
  /** Where members land, for messages (default 'the layer'). */
  destination?: string;
  /** 'anywhere' (default, layers) or 'inside' (every symlink resolves inside the destination). */
  symlinks?: 'anywhere' | 'inside';
  /**
   * 'overlay': the archive is a container image layer (OCI / Docker). Its
   * whiteouts are rewritten into overlayfs form, the form the store keeps
   * and a sandbox's overlay reads (see ImageLayer rules below), and every
   * xattr, ACL or SELinux label the archive carries is dropped, so an image
   * cannot plant overlay xattrs of its own (`trusted.overlay.redirect`,
   * a forged `user.overlay.opaque`...). Default: whiteouts are plain files.
   */
  whiteouts?: 'overlay';
}

/** The kernel's limit on symlinks followed in one lookup (MAXSYMLINKS). */
const MAX_SYMLINKS = 40;
/** symlink(2) refuses longer targets. */
const PATH_MAX = 4096;

/**
 * What a checker reports about regular files as their data passes (the
 * extractor's content hashes): a file member's header, its data bytes
 * (padding left out), the end of its data; a hard link member; a name that
 * stops being a regular file (a symlink member replacing it).
 */
export interface TarMemberWatch {
  file(name: string, size: number): void;
  data(bytes: Buffer): void;
  done(): void;
  link(name: string, target: string): void;
  gone(name: string): void;
}

/**
 * The checker itself, without a stream: bytes in through consume(), checked
 * bytes out through `out`, `end` at the end of the archive, refusals thrown
 * as `refuse(message)` makes them. It uses nothing of this module but its
 * own helpers (below), so the extractor's worker thread runs the same
 * source (see unpack.ts); TarChecker wraps it as a Transform.
 */
export class TarCheck {
  private buf: Buffer = Buffer.alloc(0);
  /** Data bytes (no padding) of the current regular file member still to come, for `watch`. */
  private dataLeft = 0;
  /** Bytes of member data (plus padding) still to pass through untouched. */
  private skip = 0;
  /** Data of a pax / GNU longname member being collected. */
  private collecting: { kind: 'x' | 'g' | 'L' | 'K'; need: number; pad: number; parts: Buffer[] } | undefined;
  private paxPath: string | undefined;
  private paxLinkpath: string | undefined;
  private paxSize: number | undefined;
  private gnuLongName: string | undefined;
  private gnuLongLink: string | undefined;
  private offset = 0;
  private zeroBlocks = 0;
  private ended = false;
  /** Symlink members: normalised name -> raw name (for messages) and target. */
  private readonly symlinks = new Map<string, { raw: string; target: string }>();
  /** The same symlinks as a trie, for resolving targets (symlinks: 'inside' only). */
  private readonly trie: TrieNode = { children: new Map() };
  private readonly files = new Set<string>();
  private readonly dirs = new Set<string>();
  /** Hard link members and their targets: names that share an inode. */
  private readonly linked = new Set<string>();
  /** A symlink was added since the last whole-archive symlink check. */
  private symlinksChanged = false;
  private readonly label: string;
  private readonly destination: string;
  private readonly symlinkPolicy: 'anywhere' | 'inside';
  /** Members checked so far (for the caller's statistics). */
  members = 0;
  /** Members whose setuid/setgid bits were cleared. */
  setidCleared = 0;
  /** Whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) rewritten ('overlay' mode). */
  whiteouts = 0;
  opaqueDirs = 0;
  private readonly image: boolean;
  /**
   * 'overlay' mode: the pending member's extended records (pax, with xattrs
   * dropped, and GNU long names as pax path/linkpath). Held back rather than
   * passed on as read, because the member they describe may be rewritten
   * (a whiteout becomes another member); they are emitted as one fresh pax
   * header in front of whatever member is emitted.
   */
  private heldPax = new Map<string, string>();
  /** 'overlay' mode: each directory member's header and pax records, re-emitted when the directory is made opaque. */
  private readonly dirHeaders = new Map<string, { block: Buffer; pax: Map<string, string> }>();

  constructor(
    archiveName: string,
    opts: TarCheckOptions,
    private readonly out: (bytes: Buffer) => void,
    private readonly end: () => void,
    private readonly refuse: (message: string) => Error,
    private readonly watch?: TarMemberWatch,
  ) {
    this.label = opts.label ?? `layer archive ${archiveName}`;
    this.destination = opts.destination ?? 'the layer';
    this.symlinkPolicy = opts.symlinks ?? 'anywhere';
    this.image = opts.whiteouts === 'overlay';
  }

  /** The input has ended: throws if it ended inside a member, or (symlinks: 'inside') if a symlink leaves. */
  finish(): void {
    if (!this.ended && (this.skip > 0 || this.collecting || this.buf.length > 0))
      throw this.refuse(`${this.label}: truncated tar stream at byte ${this.offset}`);
    this.checkAllSymlinks();
  }

  consume(chunk: Buffer): void {
    if (this.ended) return; // past end-of-archive: GNU tar stops reading too
    let pos = 0;
    while (pos < chunk.length && !this.ended) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - pos);
        this.out(chunk.subarray(pos, pos + n));
        if (this.dataLeft > 0) {
          const d = Math.min(n, this.dataLeft);
          this.watch!.data(chunk.subarray(pos, pos + d));
          this.dataLeft -= d;
          if (this.dataLeft === 0) this.watch!.done();
        }
        this.skip -= n;
        this.offset += n;
        pos += n;
        continue;
      }
      if (this.collecting) {
        const c = this.collecting;
        const n = Math.min(c.need + c.pad, chunk.length - pos);
        const dataPart = Math.min(n, c.need);
        if (dataPart > 0) c.parts.push(Buffer.from(chunk.subarray(pos, pos + dataPart)));
        c.need -= dataPart;
        c.pad -= n - dataPart;
        if (!this.image) this.out(chunk.subarray(pos, pos + n));
        this.offset += n;
        pos += n;
        if (c.need === 0 && c.pad === 0) {
          this.collecting = undefined;
          this.finishCollected(c.kind, Buffer.concat(c.parts));
        }
        continue;
      }
      // Header: need a whole 512-byte block.
      const want = 512 - this.buf.length;
      const n = Math.min(want, chunk.length - pos);
      this.buf = this.buf.length === 0 && n === 512 ? chunk.subarray(pos, pos + 512) : Buffer.concat([this.buf, chunk.subarray(pos, pos + n)]);
      pos += n;
      if (this.buf.length < 512) continue;
      const block = this.buf;
      this.buf = Buffer.alloc(0);
      this.header(block);
    }
  }

  private fail(member: string | undefined, reason: string): never {
    const what = member === undefined ? '' : ` member ${displayName(member)}`;
    throw this.refuse(`${this.label}:${what} ${reason}`);
  }

  private header(block: Buffer): void {
    const at = this.offset;
    if (isZero(block)) {
      // tar may treat this block as the end and finish (creating its delayed
      // symlinks): the whole-archive check must pass before it gets it.
      this.checkAllSymlinks();
      this.out(block);
      this.offset += 512;
      this.zeroBlocks++;
      if (this.zeroBlocks >= 2) {
        // End of archive. GNU tar stops here; anything after is never read,
        // so it is neither checked nor passed on.
        this.ended = true;
        this.end();
      }
      return;
    }
    if (this.zeroBlocks === 1) {
      // GNU tar ends the archive at a lone zero block too (with a warning):
      // what follows is never extracted, so it is not passed on either.
      this.ended = true;
      this.end();
      return;
    }
    if (!checksumOk(block)) this.fail(undefined, `bad tar header checksum at byte ${at} (corrupt or not a tar archive)`);

    const type = String.fromCharCode(block[156] ?? 0);
    const size = this.paxSize ?? parseNumeric(block.subarray(124, 136));
    if (size === undefined || size < 0) this.fail(undefined, `unreadable size field at byte ${at}`);
    const magic = block.subarray(257, 263).toString('latin1');
    const ustarName = cString(block.subarray(0, 100));
    const prefix = magic === 'ustar\0' ? cString(block.subarray(345, 500)) : '';
    const rawName = this.paxPath ?? this.gnuLongName ?? (prefix ? `${prefix}/${ustarName}` : ustarName);
    const rawLink = this.paxLinkpath ?? this.gnuLongLink ?? cString(block.subarray(157, 257));

    if (type === 'x' || type === 'g' || type === 'L' || type === 'K') {
      if (size > 1 << 20) this.fail(undefined, `${type} extended header of ${size} bytes at byte ${at} is too large`);
      if (!this.image) this.out(block);
      this.offset += 512;
      this.collecting = { kind: type, need: size, pad: padOf(size), parts: [] };
      if (size === 0) {
        this.collecting = undefined;
        this.finishCollected(type, Buffer.alloc(0));
      }
      return;
    }

    // Hard links, symlinks and directories carry no data in ustar/pax. Refuse
    // a size on them rather than guess how GNU tar would skip it: if the two
    // parsers ever disagreed on where the next header is, checks would be moot.
    if ((type === '1' || type === '2' || type === '5') && size !== 0)
      this.fail(rawName, `is a type '${type}' member with a nonzero size (${size})`);

    // A real member: the pending extended names apply to it and are consumed.
    const longName = this.gnuLongName;
    const longLink = this.gnuLongLink;
    this.paxPath = this.paxLinkpath = this.paxSize = this.gnuLongName = this.gnuLongLink = undefined;
    this.members++;
    const name = this.checkPath(rawName, rawName, 'name');
    let pax = this.heldPax;
    if (this.image) {
      this.heldPax = new Map();
      if (longName !== undefined) pax.set('path', longName);
      if (longLink !== undefined) pax.set('linkpath', longLink);
      if (this.imageSpecial(block, rawName, name, type, size, at)) return;
    }

    // Every type below is checked the same way for where it lands: not
    // through a symlink or a file, not over a symlink or a hard-linked name.
    this.notThroughSymlink(rawName, name);
    if (name !== '' && this.linked.has(name))
      this.fail(rawName, 'replaces a hard link or the target of one (it would be written through the shared inode)');
    switch (type) {
      case '0':
      case '\0':
      case '7':
        this.notReplacingSymlink(rawName, name);
        if (this.dirs.has(name)) this.fail(rawName, 'replaces a directory with a file');
        this.files.add(name);
        break;
      case '5':
        this.notReplacingSymlink(rawName, name);
        if (this.files.has(name)) this.fail(rawName, 'replaces a file with a directory');
        this.dirs.add(name);
        break;
      case '2':
        if (name === '') this.fail(rawName, `is a symlink in place of ${this.destination}'s root`);
        if (rawLink === '') this.fail(rawName, 'is a symlink with an empty target');
        if (this.dirs.has(name)) this.fail(rawName, 'replaces a directory with a symlink');
        if (this.files.delete(name)) this.watch?.gone(name);
        this.symlinks.set(name, { raw: rawName, target: rawLink });
        if (this.symlinkPolicy === 'inside') {
          let node = this.trie;
          for (const c of name.split('/')) {
            let next = node.children.get(c);
            if (!next) node.children.set(c, (next = { children: new Map() }));
            node = next;
          }
          node.link = rawLink;
          this.symlinksChanged = true;
          // Early refusal of what already leaves; chains through later
          // symlinks are caught by the check at the end of the archive.
          this.symlinkStaysInside(name);
        }
        break;
      case '1': {
        this.notReplacingSymlink(rawName, name);
        if (this.dirs.has(name)) this.fail(rawName, 'replaces a directory with a hard link');
        const target = this.checkPath(rawName, rawLink, 'hard link target');
        this.notThroughSymlink(rawName, target, 'hard link target');
        if (target === name) this.fail(rawName, 'is a hard link to itself');
        if (this.symlinks.has(target))
          this.fail(rawName, `hard link target ${displayName(rawLink)} is a symlink member (a second name for a symlink could be written through)`);
        if (!this.files.has(target)) this.fail(rawName, `hard link target ${displayName(rawLink)} is not an earlier file of the archive`);
        this.files.add(name);
        this.linked.add(name);
        this.linked.add(target);
        this.watch?.link(name, target);
        break;
      }
      case 'S':
        this.fail(rawName, 'is a GNU sparse file (not supported)');
      // falls through (fail never returns)
      default:
        this.fail(rawName, `has unsupported type '${printable(type)}' (devices, FIFOs and volume headers are refused)`);
    }
    this.addParents(name);
    const mode = parseNumeric(block.subarray(100, 108));
    if (mode === undefined) this.fail(rawName, `has an unreadable mode field at byte ${at}`);
    let out = block;
    if (mode % 0o10000 & 0o6000) {
      this.setidCleared++;
      out = withMode(block, mode % 0o10000 & ~0o6000);
    }
    if (this.image) {
      if (pax.size > 0) this.out(paxHeader('x', pax));
      if (type === '5') this.dirHeaders.set(name, { block: Buffer.from(out), pax });
    }
    this.out(out);
    this.offset += 512;
    this.skip = size + padOf(size);
    if (this.watch && (type === '0' || type === '\0' || type === '7')) {
      this.watch.file(name, size);
      this.dataLeft = size;
      if (size === 0) this.watch.done();
    }
  }

  private finishCollected(kind: 'x' | 'g' | 'L' | 'K', data: Buffer): void {
    if (kind === 'L') this.gnuLongName = cString(data);
    else if (kind === 'K') this.gnuLongLink = cString(data);
    else {
      const recs = parsePax(data, (why) => this.fail(undefined, `bad pax header (${why}) before byte ${this.offset}`));
      for (const [key, value] of recs) {
        if (key.startsWith('GNU.sparse')) this.fail(recs.get('path'), 'is a GNU sparse file (not supported)');
        if (kind === 'g' && (key === 'path' || key === 'linkpath' || key === 'size'))
          this.fail(undefined, `global pax header sets '${key}', which is refused`);
      }
      if (this.image) {
        // Dropped, never passed on: the archive's own xattrs, ACLs and labels.
        for (const key of [...recs.keys()]) if (DROPPED_PAX.some((pre) => key.startsWith(pre))) recs.delete(key);
        if (kind === 'g') {
          if (recs.size > 0) this.out(paxHeader('g', recs));
        } else for (const [k, v] of recs) this.heldPax.set(k, v);
      }
      if (kind === 'x') {
        const p = recs.get('path');
        const l = recs.get('linkpath');
        const s = recs.get('size');
        if (p !== undefined) this.paxPath = p;
        if (l !== undefined) this.paxLinkpath = l;
        if (s !== undefined) {
          if (!/^\d+$/.test(s)) this.fail(p, `bad pax size '${s}'`);
          this.paxSize = Number(s);
        }
      }
    }
  }

  /**
   * 'overlay' mode: a whiteout member is emitted in overlayfs form and true
   * is returned; false for every other member (checked and passed on by the
   * caller). Docker and OCI write `DIR/.wh.NAME` for "NAME is deleted" and
   * `DIR/.wh..wh..opq` for "DIR hides what lower layers have in it"; overlayfs
   * reads a 0/0 character device and the xattr `user.overlay.opaque=y` on
   * the directory (`userxattr` mode, as every sandbox overlay is mounted).
   * The opaque xattr is set by re-emitting DIR's own header (kept as it was
   * seen, so mode, owner and mtime stay) with a pax SCHILY.xattr record,
   * which `tar -x --xattrs --xattrs-include=user.overlay.*` applies; every
   * xattr the archive carried was dropped, so that is the only one.
   */
  private imageSpecial(block: Buffer, rawName: string, name: string, type: string, size: number, at: number): boolean {
    const parts = name.split('/');
    const base = parts[parts.length - 1]!;
    for (const c of parts.slice(0, -1))
      if (c.startsWith('.wh.')) this.fail(rawName, `lies in a directory named like a whiteout (${displayName(c)})`);
    if (!base.startsWith('.wh.')) return false;
    if (type !== '0' && type !== '\0' && type !== '7') this.fail(rawName, `is a whiteout of type '${printable(type)}' (a whiteout is an empty regular file)`);
    if (size !== 0) this.fail(rawName, `is a whiteout with ${size} bytes of data (a whiteout is empty)`);
    const dir = parts.slice(0, -1).join('/');
    this.notThroughSymlink(rawName, name);
    if (dir !== '' && (this.files.has(dir) || this.symlinks.has(dir))) this.fail(rawName, 'is a whiteout in something that is not a directory');
    if (base === '.wh..wh..opq') {
      const seen = this.dirHeaders.get(dir);
      let header: Buffer;
      let pax: Map<string, string>;
      if (seen) {
        header = seen.block;
        pax = new Map(seen.pax);
      } else {
        // The directory has no member of its own in this layer (allowed,
        // if unusual): it gets the opaque marker's owner and mtime, mode 0755.
        header = withFields(block, { type: '5', mode: 0o755, name: dir === '' ? './' : `${dir}/` });
        pax = new Map();
      }
      pax.set('path', dir === '' ? './' : `${dir}/`);
      pax.set('SCHILY.xattr.user.overlay.opaque', 'y');
      this.out(paxHeader('x', pax));
      this.out(header);
      this.dirs.add(dir);
      this.addParents(dir);
      this.opaqueDirs++;
    } else {
      if (base.startsWith('.wh..wh.')) this.fail(rawName, `is an aufs metadata entry (${displayName(base)}), which is not supported`);
      const target = base.slice(4);
      if (target === '' || target === '.' || target === '..') this.fail(rawName, `is a whiteout of ${JSON.stringify(target)}, which names nothing`);
      const victim = dir === '' ? target : `${dir}/${target}`;
      if (this.linked.has(victim)) this.fail(rawName, 'replaces a hard link or the target of one (it would be written through the shared inode)');
      if (this.symlinks.has(victim) || this.files.has(victim) || this.dirs.has(victim))
        this.fail(rawName, `deletes ${displayName(victim)}, which this same layer adds`);
      this.out(paxHeader('x', new Map([['path', victim]])));
      this.out(withFields(block, { type: '3', mode: 0, size: 0, uid: 0, gid: 0, name: victim, dev: 0 }));
      this.files.add(victim);
      this.watch?.gone(victim);
      this.addParents(victim);
      this.whiteouts++;
    }
    this.offset += 512;
    this.skip = 0;
    return true;
  }

  /** Normalise a member path to 'a/b/c' ('' for the root), refusing escapes. */
  private checkPath(member: string, raw: string, what: string): string {
    if (raw.includes('\0')) this.fail(member, `${what} contains a NUL byte`);
    if (raw === '') this.fail(member, `has an empty ${what}`);
    if (raw.startsWith('/')) {
      const reason = what === 'name' ? `has an absolute name and would land outside ${this.destination}` : `${what} ${displayName(raw)} is absolute and escapes ${this.destination}`;
      this.fail(member, reason);
    }
    const parts = raw.split('/').filter((c) => c !== '' && c !== '.');
    if (parts.includes('..')) {
      const reason = what === 'name' ? `has a '..' component and escapes ${this.destination}` : `${what} ${displayName(raw)} has a '..' component and escapes ${this.destination}`;
      this.fail(member, reason);
    }
    return parts.join('/');
  }

  private notThroughSymlink(member: string, p: string, what = 'path'): void {
    let i = p.indexOf('/');
    while (i !== -1) {
      const parent = p.slice(0, i);
      if (this.symlinks.has(parent))
        this.fail(member, `${what} goes through the symlink member ${displayName(parent)} and could write outside ${this.destination}`);
      if (this.files.has(parent)) this.fail(member, `${what} goes through the file member ${displayName(parent)}`);
      i = p.indexOf('/', i + 1);
    }
  }

  private notReplacingSymlink(member: string, p: string): void {
    if (this.symlinks.has(p)) this.fail(member, 'replaces an earlier symlink member (would be written through it)');
  }

  /** A member's parents exist as directories from now on, even without members of their own. */
  private addParents(p: string): void {
    for (let i = p.lastIndexOf('/'); i > 0; i = p.lastIndexOf('/', i - 1)) {
      const parent = p.slice(0, i);
      if (this.dirs.has(parent)) break;
      this.dirs.add(parent);
    }
  }

  private symlinkStaysInside(name: string): void {
    const link = this.symlinks.get(name)!;
    if (link.target.length >= PATH_MAX) this.fail(link.raw, `is a symlink whose target is longer than PATH_MAX (${link.target.length} bytes)`);
    const at: Array<TrieNode | undefined> = [];
    const parts = name.split('/');
    for (const c of parts.slice(0, -1)) at.push((at.length === 0 ? this.trie : at[at.length - 1])?.children.get(c));
    if (!this.walk(at, link.target, { left: MAX_SYMLINKS }))
      this.fail(link.raw, `is a symlink to ${displayName(link.target)}, which leaves ${this.destination}`);
  }

  /** Every symlink, against the archive as it stands now (a later symlink can redirect an earlier one). */
  private checkAllSymlinks(): void {
    if (this.symlinkPolicy !== 'inside' || !this.symlinksChanged) return;
    this.symlinksChanged = false;
    for (const name of this.symlinks.keys()) this.symlinkStaysInside(name);
  }

  /**
   * Walks `target` from the position `at` (the directories so far, as trie
   * nodes; undefined once off the archive's symlink paths) as the kernel
   * would, through the symlink members met on the way (a trailing one too:
   * what matters is where following it leads). False if the target is
   * absolute or any step climbs above the root. Names the archive does not
   * have count as directories, and '..' after a file pops it: both can only
   * refuse more than the kernel would reach. Past the kernel's symlink limit
   * the lookup would fail with ELOOP; the walk then goes on treating the link
   * as a directory, which again can only refuse more.
   */
  private walk(at: Array<TrieNode | undefined>, target: string, budget: { left: number }): boolean {
    if (target.startsWith('/')) return false;
    for (const c of target.split('/')) {
      if (c === '' || c === '.') continue;
      if (c === '..') {
        if (at.length === 0) return false;
        at.pop();
        continue;
      }
      const node = (at.length === 0 ? this.trie : at[at.length - 1])?.children.get(c);
      if (node?.link !== undefined && budget.left-- > 0) {
        if (!this.walk(at, node.link, budget)) return false;
        continue;
      }
      at.push(node);
    }
    return true;
  }
}

/** TarCheck as a Transform: checked bytes are pushed on, refusals are stream errors (FileError). */
export class TarChecker extends Transform {
  private readonly check: TarCheck;

  constructor(archiveName: string, opts: TarCheckOptions = {}) {
    super();
    this.check = new TarCheck(
      archiveName,
      opts,
      (b) => this.push(b),
      () => this.push(null),
      (message) => new FileError(message),
    );
  }

  /** Members checked so far (for the caller's statistics). */
  get members(): number {
    return this.check.members;
  }
  get setidCleared(): number {
    return this.check.setidCleared;
  }
  get whiteouts(): number {
    return this.check.whiteouts;
  }
  get opaqueDirs(): number {
    return this.check.opaqueDirs;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    try {
      this.check.consume(chunk);
      cb();
    } catch (err) {
      cb(err as Error);
    }
  }

  override _flush(cb: TransformCallback): void {
    try {
      this.check.finish();
      cb();
    } catch (err) {
      cb(err as Error);
    }
  }
}

/** Symlink members' paths, one node per component, so a walk costs O(1) a step. */
interface TrieNode {
  children: Map<string, TrieNode>;
  /** Set when this path is a symlink member: its target. */
  link?: string;
}

/** A copy of a header block with a new mode field and checksum (GNU tar's field formats). */
function withMode(block: Buffer, mode: number): Buffer {
  const out = Buffer.from(block);
  out.write(`${mode.toString(8).padStart(7, '0')}\0`, 100, 8, 'latin1');
  out.fill(0x20, 148, 156);
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += out[i]!;
  out.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'latin1');
  return out;
}

/** pax records of an image's own that never reach tar ('overlay' mode): xattrs, ACLs, SELinux labels. */
const DROPPED_PAX = ['SCHILY.xattr.', 'LIBARCHIVE.xattr.', 'SCHILY.acl.', 'RHT.security.selinux', 'SCHILY.fflags'];

/** A header block with fields replaced and the checksum recomputed; a name longer than the field is cut (a pax path comes with it). */
function withFields(block: Buffer, f: { type?: string; mode?: number; size?: number; uid?: number; gid?: number; name?: string; dev?: number }): Buffer {
  const out = Buffer.from(block);
  const octal = (value: number, at: number, len: number) => out.write(`${value.toString(8).padStart(len - 1, '0')}\0`, at, len, 'latin1');
  if (f.type !== undefined) out.write(f.type, 156, 1, 'latin1');
  if (f.mode !== undefined) octal(f.mode, 100, 8);
  if (f.uid !== undefined) octal(f.uid, 108, 8);
  if (f.gid !== undefined) octal(f.gid, 116, 8);
  if (f.size !== undefined) octal(f.size, 124, 12);
  if (f.name !== undefined) {
    out.fill(0, 0, 100);
    out.write(f.name, 0, Math.min(100, Buffer.byteLength(f.name, 'latin1')), 'latin1');
    out.fill(0, 345, 500); // ustar prefix: the name is whole in the pax path
    out.fill(0, 157, 257); // no link name
  }
  if (f.dev !== undefined) {
    out.write('ustar\0' + '00', 257, 8, 'latin1');
    octal(f.dev, 329, 8);
    octal(f.dev, 337, 8);
  }
  return withChecksum(out);
}

function withChecksum(out: Buffer): Buffer {
  out.fill(0x20, 148, 156);
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += out[i]!;
  out.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'latin1');
  return out;
}

/** A pax extended header ('x' or 'g') holding `records` (latin1 byte strings), data and padding included. */
function paxHeader(kind: 'x' | 'g', records: Map<string, string>): Buffer {
  const recs: Buffer[] = [];
  for (const [k, v] of records) {
    const body = Buffer.from(` ${k}=${v}\n`, 'latin1');
    // The length prefix counts itself.
    let len = body.length + 1;
    while (String(len).length + body.length !== len) len = String(len).length + body.length;
    recs.push(Buffer.concat([Buffer.from(String(len), 'latin1'), body]));
  }
  const data = Buffer.concat(recs);
  const h = Buffer.alloc(512);
  h.write('././@PaxHeader', 0, 'latin1');
  h.write('0000644\0', 100, 'latin1');
  h.write('0000000\0', 108, 'latin1');
  h.write('0000000\0', 116, 'latin1');
  h.write(`${data.length.toString(8).padStart(11, '0')}\0`, 124, 'latin1');
  h.write('00000000000\0', 136, 'latin1');
  h.write(kind, 156, 'latin1');
  h.write('ustar\0' + '00', 257, 'latin1');
  return Buffer.concat([withChecksum(h), data, Buffer.alloc(padOf(data.length))]);
}

function padOf(size: number): number {
  return (512 - (size % 512)) % 512;
}

function isZero(block: Buffer): boolean {
  for (let i = 0; i < block.length; i++) if (block[i] !== 0) return false;
  return true;
}

function checksumOk(block: Buffer): boolean {
  const stored = parseNumeric(block.subarray(148, 156));
  if (stored === undefined) return false;
  // The checksum field counts as eight spaces. One pass: the signed sum
  // differs from the unsigned one by 256 for each byte above 127.
  let unsigned = 8 * 32;
  let high = 0;
  for (let i = 0; i < 512; i++) {
    if (i === 148) i = 156;
    const b = block[i]!;
    unsigned += b;
    if (b > 127) high++;
  }
  // Old tars summed signed chars; GNU tar accepts either.
  return stored === unsigned || stored === unsigned - 256 * high;
}

/** Octal (NUL/space terminated) or GNU base-256 numeric field. */
function parseNumeric(field: Buffer): number | undefined {
  const first = field[0] ?? 0;
  if (first & 0x80) {
    if (first === 0xff) return undefined; // negative
    let v = first & 0x7f;
    for (let i = 1; i < field.length; i++) v = v * 256 + (field[i] ?? 0);
    return v;
  }
  // Fast path, the usual field: spaces, octal digits, spaces, up to a NUL
  // or the end. Anything else takes the general rule below.
  let i = 0;
  const n = field.length;
  while (i < n && field[i] === 0x20) i++;
  let v = 0;
  while (i < n && field[i]! >= 0x30 && field[i]! <= 0x37) {
    v = v * 8 + (field[i]! - 0x30);
    i++;
  }
  while (i < n && field[i] === 0x20) i++;
  if (i === n || field[i] === 0) return v;
  const s = field.toString('latin1').replace(/\0.*$/s, '').trim();
  if (s === '') return 0;
  if (!/^[0-7]+$/.test(s)) return undefined;
  return parseInt(s, 8);
}

/** Bytes up to the first NUL, as a 1:1 byte string (latin1) for exact compares. */
function cString(b: Buffer): string {
  const nul = b.indexOf(0);
  return b.subarray(0, nul === -1 ? b.length : nul).toString('latin1');
}

function parsePax(data: Buffer, bad: (why: string) => never): Map<string, string> {
  const out = new Map<string, string>();
  let pos = 0;
  while (pos < data.length) {
    const sp = data.indexOf(0x20, pos);
    if (sp === -1) bad('no length');
    const len = Number(data.subarray(pos, sp).toString('latin1'));
    if (!Number.isInteger(len) || len <= 0 || pos + len > data.length) bad('bad record length');
    const rec = data.subarray(sp + 1, pos + len - 1); // drop trailing '\n'
    const eq = rec.indexOf(0x3d);
    if (eq === -1) bad('record without =');
    // pax values are UTF-8; keep them as the same bytes in latin1 form, like
    // the ustar fields, so comparisons are byte-exact.
    out.set(rec.subarray(0, eq).toString('latin1'), rec.subarray(eq + 1).toString('latin1'));
    pos += len;
  }
  return out;
}

/** Member name for messages: the bytes as UTF-8, control characters escaped. */
function displayName(latin1: string): string {
  return printable(Buffer.from(latin1, 'latin1').toString('utf8'));
}

function printable(s: string): string {
  return s.replace(/[\x00-\x1f\x7f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

/**
 * TarCheck and everything it uses, as JavaScript source that defines them in
 * a module of its own (the extractor's worker thread: unpack.ts). Built from
 * the functions themselves, so the worker runs exactly this file's checks.
 */
export function tarCheckSource(): string {
  return [
    `const MAX_SYMLINKS = ${MAX_SYMLINKS};`,
    `const PATH_MAX = ${PATH_MAX};`,
    `const DROPPED_PAX = ${JSON.stringify(DROPPED_PAX)};`,
    ...[withMode, withFields, withChecksum, paxHeader, padOf, isZero, checksumOk, parseNumeric, cString, parsePax, displayName, printable].map((f) => f.toString()),
    TarCheck.toString(),
  ].join('\n');
}
