//! cutfs: a FUSE file system that loses power on command (tests/README.md, "Power cuts").
//!
//! Every write goes through to a backing directory at once, so the process above sees
//! its own writes, as through a page cache. What a real disk would not yet hold is kept
//! aside as an undo record: the length a file had at its last fsync and the old bytes of
//! any durable range overwritten since; the directory entries each directory had at its
//! last fsync. `cut` over the control socket kills the process using the file system
//! (SIGKILL) and rolls every file and directory back to its durable state: a created file
//! whose directory was not fsynced is gone, a rename not fsynced is undone, an unsynced
//! append is truncated (or, with `tear`, kept in part at a block boundary, or kept as
//! zeros), an unsynced overwrite is undone (with `tear`, block by block at random).
//! Handles opened before a cut answer EIO for ever after, so a dying process's last
//! writes (io_uring workers, an mmap's writeback at exit) cannot land on the restored
//! state. `fail` injects faults: EIO from the next fsyncs, EIO or ENOSPC or a short
//! count from the next writes.
//!
//! The namespace lives in memory; file data lives in `<backing>/<inode>`. Nothing
//! survives the cutfs process: each test mounts a fresh one.
//!
//! Usage: cutfs BACKING_DIR MOUNTPOINT CONTROL_SOCKET
//!
//! Control commands, one per line, each answered with one line (`ok ...` or `err ...`):
//!   cut pid=P [tear=none|keep|zero] [block=4096] [seed=N]
//!   fail fsync|write eio|enospc|short [path=PATTERN] [count=N]
//!                    (PATTERN: a substring of the file's path; `*` stands for any run
//!                    of characters, so `/pc-2/*.log` is that partition's segments)
//!   clear            (drop the fault rules)
//!   stats
//!   quit             (unmount and exit)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, MountOption, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session, TimeOrNow, WriteFlags,
};

/// The kernel asks again for every lookup and attribute: after a cut, names and sizes
/// change under it.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

/// An injected fault: the next `count` matching operations fail (or are cut short).
#[derive(Debug, Clone)]
struct Fault {
    op: FaultOp,
    kind: FaultKind,
    path: Option<String>,
    count: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum FaultOp {
    Fsync,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum FaultKind {
    Eio,
    Enospc,
    Short,
}

/// What a cut does to data that was written but not made durable.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tear {
    /// All of it is lost.
    None,
    /// Part of it reached the disk: a random number of whole blocks of each unsynced
    /// tail, each unsynced overwritten block with probability 1/2.
    Keep,
    /// As `Keep`, but the kept tail blocks hold zeros (the size reached the disk, the
    /// data did not).
    Zero,
}

/// What a file's disk holds, as far as it differs from what the backing file holds.
#[derive(Debug, Default, Clone)]
struct Undo {
    /// The file's length at its last fsync.
    durable_len: u64,
    /// Old bytes of durable ranges overwritten since (each range saved once).
    saved: Vec<(u64, Vec<u8>)>,
    /// Ranges of `[0, durable_len)` already in `saved`, sorted, disjoint.
    covered: Vec<(u64, u64)>,
}

struct FileBody {
    backing: File,
    undo: Undo,
    /// An fsync failed (injected EIO): what the disk held before it. At a cut the file
    /// goes back to this, even if a later fsync succeeded: the failed data never reached
    /// the disk, and the model does not try to keep what was appended after it.
    doomed: Option<Undo>,
}

struct DirBody {
    entries: BTreeMap<OsString, u64>,
    /// The entries at the directory's last fsync.
    durable: BTreeMap<OsString, u64>,
}

enum Body {
    File(FileBody),
    Dir(DirBody),
}

struct Node {
    body: Body,
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    /// Entries naming this node now, and at their directories' last fsyncs.
    links: u32,
    durable_links: u32,
    open: u32,
    /// Where it was last named (for fault rules' path matches).
    parent: u64,
    name: OsString,
}

#[derive(Default, Debug)]
struct Stats {
    cuts: u64,
    fsyncs: u64,
    dir_fsyncs: u64,
    writes: u64,
    faults_fired: u64,
    /// At the last cut.
    files_rolled_back: u64,
    bytes_dropped: u64,
    entries_rolled_back: u64,
    nodes_removed: u64,
}

struct State {
    backing_dir: PathBuf,
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Open handles: fh -> inode. Emptied at a cut: older handles answer EIO.
    handles: HashMap<u64, u64>,
    next_fh: u64,
    powered: bool,
    faults: Vec<Fault>,
    stats: Stats,
}

struct CutFs {
    state: Arc<Mutex<State>>,
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

/// splitmix64: a seeded, replayable choice of what a torn cut keeps.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

impl Undo {
    /// Saves the old bytes of `[start, end)`'s durable part not saved yet.
    fn save(&mut self, file: &File, start: u64, end: u64) -> std::io::Result<()> {
        let end = end.min(self.durable_len);
        let mut at = start;
        while at < end {
            // The next covered range at or after `at`.
            let next = self.covered.iter().find(|&&(_, e)| e > at).copied();
            match next {
                Some((s, e)) if s <= at => at = e,
                other => {
                    let stop = other.map_or(end, |(s, _)| s.min(end));
                    let mut old = vec![0u8; (stop - at) as usize];
                    let n = read_full(file, &mut old, at)?;
                    old.truncate(n);
                    old.resize((stop - at) as usize, 0);
                    self.saved.push((at, old));
                    self.covered.push((at, stop));
                    self.covered.sort_unstable();
                    at = stop;
                }
            }
        }
        Ok(())
    }

    /// Puts the file back as the disk holds it.
    fn restore(&self, file: &File, tear: Tear, block: u64, rng: &mut Rng) -> std::io::Result<u64> {
        let len = file.metadata()?.len();
        if len < self.durable_len {
            file.set_len(self.durable_len)?;
        }
        let mut dropped = 0u64;
        for (off, old) in self.saved.iter().rev() {
            if tear == Tear::None {
                file.write_all_at(old, *off)?;
                dropped += old.len() as u64;
                continue;
            }
            for (i, chunk) in old.chunks(block as usize).enumerate() {
                if rng.below(2) == 0 {
                    file.write_all_at(chunk, off + i as u64 * block)?;
                    dropped += chunk.len() as u64;
                }
            }
        }
        let mut keep = self.durable_len;
        if len > self.durable_len && tear != Tear::None {
            let blocks = (len - self.durable_len).div_ceil(block);
            let kept = rng.below(blocks + 1);
            keep = (self.durable_len + kept * block).min(len);
            if tear == Tear::Zero && keep > self.durable_len {
                let zeros = vec![0u8; (keep - self.durable_len) as usize];
                file.write_all_at(&zeros, self.durable_len)?;
            }
        }
        dropped += len.saturating_sub(keep);
        file.set_len(keep)?;
        Ok(dropped)
    }
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

impl State {
    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&DirBody, Errno> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut DirBody, Errno> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn powered(&self) -> Result<(), Errno> {
        if self.powered {
            Ok(())
        } else {
            eprintln!("cutfs: EIO while the power is off");
            Err(Errno::EIO)
        }
    }

    /// The inode behind an open handle; handles from before a cut are gone.
    fn handle(&self, fh: FileHandle) -> Result<u64, Errno> {
        self.powered()?;
        self.handles.get(&fh.0).copied().ok_or_else(|| {
            eprintln!("cutfs: EIO for handle {} (closed, or from before a cut)", fh.0);
            Errno::EIO
        })
    }

    fn path(&self, mut ino: u64) -> String {
        let mut parts = Vec::new();
        while ino != ROOT {
            let Some(n) = self.nodes.get(&ino) else { break };
            parts.push(n.name.to_string_lossy().into_owned());
            ino = n.parent;
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// The first matching fault rule fires (and counts down).
    fn fault(&mut self, op: FaultOp, ino: u64) -> Option<FaultKind> {
        let path = self.path(ino);
        let i = self
            .faults
            .iter()
            .position(|f| f.op == op && f.count > 0 && f.path.as_ref().is_none_or(|p| path_matches(&path, p)))?;
        let f = &mut self.faults[i];
        f.count -= 1;
        let kind = f.kind;
        if f.count == 0 {
            self.faults.remove(i);
        }
        self.stats.faults_fired += 1;
        eprintln!("cutfs: fault {op:?} {kind:?} on {path}");
        Some(kind)
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let n = self.node(ino)?;
        let (kind, size, blocks) = match &n.body {
            Body::File(f) => {
                let m = f.backing.metadata().map_err(errno)?;
                (FileType::RegularFile, m.len(), std::os::unix::fs::MetadataExt::blocks(&m))
            }
            Body::Dir(d) => (FileType::Directory, 4096 + d.entries.len() as u64, 8),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks,
            atime: n.mtime,
            mtime: n.mtime,
            ctime: n.mtime,
            crtime: n.mtime,
            kind,
            perm: n.perm,
            nlink: n.links.max(1) + u32::from(kind == FileType::Directory),
            uid: n.uid,
            gid: n.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn backing_path(&self, ino: u64) -> PathBuf {
        self.backing_dir.join(ino.to_string())
    }

    fn new_node(&mut self, req: &Request, parent: u64, name: &OsStr, mode: u32, dir: bool) -> Result<u64, Errno> {
        self.powered()?;
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let body = if dir {
            Body::Dir(DirBody { entries: BTreeMap::new(), durable: BTreeMap::new() })
        } else {
            let backing = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(self.backing_path(ino))
                .map_err(errno)?;
            Body::File(FileBody { backing, undo: Undo::default(), doomed: None })
        };
        self.nodes.insert(
            ino,
            Node {
                body,
                perm: (mode & 0o7777) as u16,
                uid: req.uid(),
                gid: req.gid(),
                mtime: now(),
                links: 1,
                durable_links: 0,
                open: 0,
                parent,
                name: name.to_owned(),
            },
        );
        self.dir_mut(parent)?.entries.insert(name.to_owned(), ino);
        Ok(ino)
    }

    /// Drops a node nothing names, now or durably, and nothing holds open.
    fn maybe_free(&mut self, ino: u64) {
        let Some(n) = self.nodes.get(&ino) else { return };
        if ino == ROOT || n.links > 0 || n.durable_links > 0 || n.open > 0 {
            return;
        }
        let n = self.nodes.remove(&ino).expect("present");
        match n.body {
            Body::File(_) => {
                let _ = std::fs::remove_file(self.backing_path(ino));
            }
            Body::Dir(d) => {
                for child in d.durable.values() {
                    if let Some(c) = self.nodes.get_mut(child) {
                        c.durable_links -= 1;
                    }
                    self.maybe_free(*child);
                }
            }
        }
    }

    /// Removes `name` from `parent` (unlink, rmdir, a rename's replaced target).
    fn remove_entry(&mut self, parent: u64, name: &OsStr, want_dir: Option<bool>) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        match (&self.node(ino)?.body, want_dir) {
            (Body::Dir(_), Some(false)) => return Err(Errno::EISDIR),
            (Body::File(_), Some(true)) => return Err(Errno::ENOTDIR),
            (Body::Dir(d), _) if !d.entries.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.dir_mut(parent)?.entries.remove(name);
        self.node_mut(ino)?.links -= 1;
        self.maybe_free(ino);
        Ok(())
    }

    fn write(&mut self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let ino = self.handle(fh)?;
        let mut len = data.len();
        match self.fault(FaultOp::Write, ino) {
            Some(FaultKind::Eio) => return Err(Errno::EIO),
            Some(FaultKind::Enospc) => return Err(Errno::ENOSPC),
            Some(FaultKind::Short) => len = (len / 2).max(1).min(len),
            None => {}
        }
        let n = self.node_mut(ino)?;
        n.mtime = now();
        let Body::File(f) = &mut n.body else { return Err(Errno::EISDIR) };
        f.undo.save(&f.backing, offset, offset + len as u64).map_err(errno)?;
        f.backing.write_all_at(&data[..len], offset).map_err(errno)?;
        self.stats.writes += 1;
        Ok(len as u32)
    }

    fn fsync(&mut self, fh: FileHandle) -> Result<(), Errno> {
        let ino = self.handle(fh)?;
        let fault = self.fault(FaultOp::Fsync, ino);
        let Body::File(f) = &mut self.node_mut(ino)?.body else { return Err(Errno::EISDIR) };
        let len = f.backing.metadata().map_err(errno)?.len();
        let fresh = Undo { durable_len: len, ..Undo::default() };
        let before = std::mem::replace(&mut f.undo, fresh);
        match fault {
            Some(FaultKind::Eio | FaultKind::Enospc) => {
                // fsyncgate: the pages are clean now, and their data never reached the disk.
                if f.doomed.is_none() {
                    f.doomed = Some(before);
                }
                Err(Errno::EIO)
            }
            _ => {
                self.stats.fsyncs += 1;
                Ok(())
            }
        }
    }

    fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        let Body::File(f) = &mut self.node_mut(ino)?.body else { return Err(Errno::EISDIR) };
        f.undo.save(&f.backing, size, u64::MAX).map_err(errno)?;
        f.backing.set_len(size).map_err(errno)
    }

    /// The power goes: every file and directory back to what the disk holds.
    fn cut(&mut self, tear: Tear, block: u64, seed: u64) -> Result<(), std::io::Error> {
        self.powered = false;
        self.handles.clear();
        let mut rng = Rng(seed);
        let (mut files, mut bytes, mut entries) = (0, 0, 0);
        let mut inos: Vec<u64> = self.nodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in &inos {
            let n = self.nodes.get_mut(ino).expect("listed");
            n.open = 0;
            match &mut n.body {
                Body::File(f) => {
                    let mut dropped = f.undo.restore(&f.backing, tear, block, &mut rng)?;
                    let len = f.backing.metadata()?.len();
                    let mut undo = Undo { durable_len: len, ..Undo::default() };
                    if let Some(doomed) = f.doomed.take() {
                        dropped += doomed.restore(&f.backing, Tear::None, block, &mut rng)?;
                        undo.durable_len = doomed.durable_len;
                    }
                    f.undo = undo;
                    if dropped > 0 {
                        files += 1;
                        bytes += dropped;
                    }
                }
                Body::Dir(d) => {
                    if d.entries != d.durable {
                        entries += 1;
                        d.entries = d.durable.clone();
                    }
                }
            }
        }
        // What no durable entry reaches from the root is gone.
        let mut reachable = HashSet::from([ROOT]);
        let mut stack = vec![ROOT];
        let mut names: Vec<(u64, u64, OsString)> = Vec::new();
        while let Some(ino) = stack.pop() {
            if let Some(Node { body: Body::Dir(d), .. }) = self.nodes.get(&ino) {
                for (name, child) in &d.entries {
                    names.push((*child, ino, name.clone()));
                    if reachable.insert(*child) {
                        stack.push(*child);
                    }
                }
            }
        }
        let before = self.nodes.len();
        let gone: Vec<u64> = inos.iter().copied().filter(|i| !reachable.contains(i)).collect();
        for ino in gone {
            if let Some(Node { body: Body::File(_), .. }) = self.nodes.remove(&ino) {
                std::fs::remove_file(self.backing_path(ino))?;
            }
        }
        for n in self.nodes.values_mut() {
            n.links = 0;
        }
        for (child, parent, name) in names {
            let n = self.nodes.get_mut(&child).expect("reachable");
            n.links += 1;
            n.parent = parent;
            n.name = name;
        }
        for n in self.nodes.values_mut() {
            n.durable_links = n.links;
        }
        self.stats.cuts += 1;
        self.stats.files_rolled_back = files;
        self.stats.bytes_dropped = bytes;
        self.stats.entries_rolled_back = entries;
        self.stats.nodes_removed = (before - self.nodes.len()) as u64;
        Ok(())
    }
}

impl CutFs {
    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Filesystem for CutFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let st = self.st();
        let r = st.dir(parent.0).and_then(|d| d.entries.get(name).copied().ok_or(Errno::ENOENT));
        match r.and_then(|ino| st.attr(ino)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.st().attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.st();
        let r = (|| {
            st.powered()?;
            if let Some(size) = size {
                st.truncate(ino.0, size)?;
            }
            let n = st.node_mut(ino.0)?;
            if let Some(m) = mode {
                n.perm = (m & 0o7777) as u16;
            }
            if let Some(u) = uid {
                n.uid = u;
            }
            if let Some(g) = gid {
                n.gid = g;
            }
            match mtime {
                Some(TimeOrNow::SpecificTime(t)) => n.mtime = t,
                Some(TimeOrNow::Now) => n.mtime = now(),
                None => {}
            }
            st.attr(ino.0)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut st = self.st();
        match st.new_node(req, parent.0, name, mode & !umask, true).and_then(|i| st.attr(i)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st();
        match st.powered().and_then(|()| st.remove_entry(parent.0, name, Some(false))) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st();
        match st.powered().and_then(|()| st.remove_entry(parent.0, name, Some(true))) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st();
        let r = (|| {
            st.powered()?;
            if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
                return Err(Errno::EINVAL);
            }
            let ino = *st.dir(parent.0)?.entries.get(name).ok_or(Errno::ENOENT)?;
            if let Some(&target) = st.dir(newparent.0)?.entries.get(newname) {
                if target == ino {
                    return Ok(());
                }
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                let is_dir = matches!(st.node(ino)?.body, Body::Dir(_));
                st.remove_entry(newparent.0, newname, Some(is_dir))?;
            }
            st.dir_mut(parent.0)?.entries.remove(name);
            st.dir_mut(newparent.0)?.entries.insert(newname.to_owned(), ino);
            let n = st.node_mut(ino)?;
            n.parent = newparent.0;
            n.name = newname.to_owned();
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let mut st = self.st();
        let r = (|| {
            st.powered()?;
            if matches!(st.node(ino.0)?.body, Body::Dir(_)) {
                return Err(Errno::EPERM);
            }
            if st.dir(newparent.0)?.entries.contains_key(newname) {
                return Err(Errno::EEXIST);
            }
            st.dir_mut(newparent.0)?.entries.insert(newname.to_owned(), ino.0);
            st.node_mut(ino.0)?.links += 1;
            st.attr(ino.0)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.st();
        let r = (|| {
            st.powered()?;
            if matches!(st.node(ino.0)?.body, Body::Dir(_)) {
                return Err(Errno::EISDIR);
            }
            if flags.0 & libc::O_TRUNC != 0 {
                st.truncate(ino.0, 0)?;
            }
            st.node_mut(ino.0)?.open += 1;
            let fh = st.next_fh;
            st.next_fh += 1;
            st.handles.insert(fh, ino.0);
            Ok(fh)
        })();
        match r {
            // No FOPEN_KEEP_CACHE: each open drops the kernel's cached pages, which
            // after a cut may hold data the disk lost.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.st();
        let r = st.new_node(req, parent.0, name, mode & !umask, false).and_then(|ino| {
            st.node_mut(ino)?.open += 1;
            let fh = st.next_fh;
            st.next_fh += 1;
            st.handles.insert(fh, ino);
            Ok((st.attr(ino)?, fh))
        });
        match r {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.st();
        let r = (|| {
            let ino = st.handle(fh)?;
            let Body::File(f) = &st.node(ino)?.body else { return Err(Errno::EISDIR) };
            let mut buf = vec![0u8; size as usize];
            let n = read_full(&f.backing, &mut buf, offset).map_err(errno)?;
            buf.truncate(n);
            Ok(buf)
        })();
        match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.st().write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st();
        if let Some(ino) = st.handles.remove(&fh.0) {
            if let Some(n) = st.nodes.get_mut(&ino) {
                n.open = n.open.saturating_sub(1);
            }
            st.maybe_free(ino);
        }
        reply.ok();
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if req.pid() == std::process::id() {
            // cutfs's own, after a cut (`forget_writeback_errors`): the disk already
            // holds exactly what is durable; no fault rule counts it.
            reply.ok();
            return;
        }
        match self.st().fsync(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let st = self.st();
        match st.powered().and_then(|()| st.dir(ino.0).map(|_| ())) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let st = self.st();
        let r = (|| {
            let d = st.dir(ino.0)?;
            let parent = st.node(ino.0)?.parent;
            let mut all =
                vec![(ino.0, FileType::Directory, OsString::from(".")), (parent, FileType::Directory, "..".into())];
            for (name, child) in &d.entries {
                let kind = match st.node(*child)?.body {
                    Body::Dir(_) => FileType::Directory,
                    Body::File(_) => FileType::RegularFile,
                };
                all.push((*child, kind, name.clone()));
            }
            Ok(all)
        })();
        match r {
            Ok(all) => {
                for (i, (child, kind, name)) in all.iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(*child), i as u64 + 1, *kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut st = self.st();
        let r = (|| {
            st.powered()?;
            let d = st.dir_mut(ino.0)?;
            let old = std::mem::replace(&mut d.durable, d.entries.clone());
            let new: Vec<u64> = d.durable.values().copied().collect();
            for child in &new {
                if let Some(c) = st.nodes.get_mut(child) {
                    c.durable_links += 1;
                }
            }
            for child in old.values() {
                if let Some(c) = st.nodes.get_mut(child) {
                    c.durable_links -= 1;
                }
                st.maybe_free(*child);
            }
            st.stats.dir_fsyncs += 1;
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.st();
        let path = std::ffi::CString::new(st.backing_dir.as_os_str().as_bytes()).expect("no NUL");
        // SAFETY: a valid C string and an out-parameter of the right type.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(std::io::Error::last_os_error()));
        }
        reply.statfs(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize as u32, 255, s.f_frsize as u32);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st();
        let r = (|| {
            let ino = st.handle(fh)?;
            let Body::File(f) = &mut st.node_mut(ino)?.body else { return Err(Errno::EISDIR) };
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                f.undo.save(&f.backing, offset, offset + length).map_err(errno)?;
            }
            // SAFETY: fallocate on a descriptor we own.
            let rc =
                unsafe { libc::fallocate(f.backing.as_raw_fd(), mode, offset as libc::off_t, length as libc::off_t) };
            if rc != 0 {
                return Err(errno(std::io::Error::last_os_error()));
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let st = self.st();
        let r = (|| {
            let ino = st.handle(fh)?;
            let Body::File(f) = &st.node(ino)?.body else { return Err(Errno::EISDIR) };
            // SAFETY: lseek on a descriptor we own (SEEK_DATA/SEEK_HOLE: the backing
            // file's holes are the file's).
            let at = unsafe { libc::lseek(f.backing.as_raw_fd(), offset, whence) };
            if at < 0 {
                return Err(errno(std::io::Error::last_os_error()));
            }
            Ok(at)
        })();
        match r {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }
}

/// Waits until `pid` has exited (gone, or a zombie: every thread has left, its files and
/// mappings are released), at most `limit`.
fn wait_dead(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(s) => {
                // The state follows the parenthesised command name.
                let state = s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
                if matches!(state, Some("Z" | "X")) {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn arg<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    words.iter().find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn command(state: &Mutex<State>, notifier: &Notifier, mountpoint: &Path, line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    match words.first().copied() {
        Some("cut") => {
            let pid: i32 = arg(&words, "pid").ok_or("cut needs pid=P")?.parse().map_err(|e| format!("pid: {e}"))?;
            if pid <= 0 {
                // kill(2) would signal a process group, or every process.
                return Err(format!("pid={pid}: one process, > 0"));
            }
            let tear = match arg(&words, "tear").unwrap_or("none") {
                "none" => Tear::None,
                "keep" => Tear::Keep,
                "zero" => Tear::Zero,
                t => return Err(format!("tear={t}: none, keep or zero")),
            };
            let block: u64 = arg(&words, "block").unwrap_or("4096").parse().map_err(|e| format!("block: {e}"))?;
            if block == 0 {
                return Err("block=0".into());
            }
            let seed: u64 = arg(&words, "seed").unwrap_or("0").parse().map_err(|e| format!("seed: {e}"))?;
            let started = Instant::now();
            let inos: Vec<u64> = {
                let mut st = lock();
                // The same instant, under the lock no file system operation runs without:
                // the process stops being served, and the disk is what it was.
                st.powered = false;
                // SAFETY: kill(2) with a pid and a signal number.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                st.cut(tear, block, seed).map_err(|e| format!("cut: {e}"))?;
                st.nodes.keys().copied().collect()
            };
            if !wait_dead(pid, Duration::from_secs(30)) {
                return Err(format!("pid {pid} still running 30 s after SIGKILL"));
            }
            for ino in inos {
                // The kernel's cached pages and sizes may hold what the disk lost; a node
                // the kernel does not know answers ENOENT, which is fine.
                let _ = notifier.inval_inode(INodeNo(ino), 0, -1);
            }
            lock().powered = true;
            forget_writeback_errors(mountpoint);
            let st = lock();
            let s = &st.stats;
            Ok(format!(
                "cuts={} files_rolled_back={} bytes_dropped={} entries_rolled_back={} nodes_removed={} ms={}",
                s.cuts,
                s.files_rolled_back,
                s.bytes_dropped,
                s.entries_rolled_back,
                s.nodes_removed,
                started.elapsed().as_millis()
            ))
        }
        Some("fail") => {
            let op = match words.get(1).copied() {
                Some("fsync") => FaultOp::Fsync,
                Some("write") => FaultOp::Write,
                o => return Err(format!("fail {o:?}: fsync or write")),
            };
            let kind = match words.get(2).copied() {
                Some("eio") => FaultKind::Eio,
                Some("enospc") => FaultKind::Enospc,
                Some("short") => FaultKind::Short,
                k => return Err(format!("fail {op:?} {k:?}: eio, enospc or short")),
            };
            let count: u64 = arg(&words, "count").unwrap_or("1").parse().map_err(|e| format!("count: {e}"))?;
            let path = arg(&words, "path").map(str::to_owned);
            lock().faults.push(Fault { op, kind, path, count });
            Ok("armed".into())
        }
        Some("clear") => {
            lock().faults.clear();
            Ok("cleared".into())
        }
        Some("stats") => {
            let st = lock();
            let s = &st.stats;
            Ok(format!(
                "cuts={} fsyncs={} dir_fsyncs={} writes={} faults_fired={} nodes={} faults_armed={}",
                s.cuts,
                s.fsyncs,
                s.dir_fsyncs,
                s.writes,
                s.faults_fired,
                st.nodes.len(),
                st.faults.len()
            ))
        }
        other => Err(format!("unknown command {other:?}")),
    }
}

fn serve(stream: UnixStream, state: &Mutex<State>, notifier: &Notifier, mountpoint: &Path) -> std::io::Result<bool> {
    let mut out = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        if line.trim() == "quit" {
            writeln!(out, "ok bye")?;
            return Ok(true);
        }
        match command(state, notifier, mountpoint, &line) {
            Ok(s) => writeln!(out, "ok {s}")?,
            Err(e) => writeln!(out, "err {e}")?,
        }
    }
    Ok(false)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, backing, mountpoint, control] = &args[..] else {
        eprintln!("usage: cutfs BACKING_DIR MOUNTPOINT CONTROL_SOCKET");
        std::process::exit(2);
    };
    let backing = Path::new(backing);
    std::fs::create_dir_all(backing).expect("backing dir");
    if std::fs::read_dir(backing).expect("backing dir").next().is_some() {
        eprintln!("cutfs: {} is not empty (each mount starts empty)", backing.display());
        std::process::exit(2);
    }
    let mut nodes = HashMap::new();
    nodes.insert(
        ROOT,
        Node {
            body: Body::Dir(DirBody { entries: BTreeMap::new(), durable: BTreeMap::new() }),
            perm: 0o755,
            uid: 0,
            gid: 0,
            mtime: now(),
            links: 1,
            durable_links: 1,
            open: 0,
            parent: ROOT,
            name: OsString::new(),
        },
    );
    let state = Arc::new(Mutex::new(State {
        backing_dir: backing.to_owned(),
        nodes,
        next_ino: ROOT + 1,
        handles: HashMap::new(),
        next_fh: 1,
        powered: true,
        faults: Vec::new(),
        stats: Stats::default(),
    }));
    let _ = std::fs::remove_file(control);
    let listener = UnixListener::bind(control).expect("control socket");
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("cutfs".into()), MountOption::Subtype("cutfs".into())];
    let session = Session::new(CutFs { state: state.clone() }, mountpoint, &config).expect("mount");
    let notifier = session.notifier();
    let background = session.spawn().expect("session thread");
    eprintln!("cutfs: {} mounted, control {}", mountpoint, control);
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        match serve(stream, &state, &notifier, Path::new(mountpoint)) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => eprintln!("cutfs: control connection: {e}"),
        }
    }
    let _ = background.umount_and_join();
    let _ = std::fs::remove_file(control);
}

/// After a cut: the kernel's page cache may have held dirty pages of a file (an mmap of
/// the dead process) that the invalidation could not write back (no open file left to
/// write through), and the kernel then keeps an unreported writeback error (EIO) for that
/// file, which the next process to open it would get from its first fsync, though the
/// power came back with nothing pending. Opening and fsyncing every file here reports
/// those errors to cutfs itself (a file opened after an error has been reported does not
/// see it). Errors here are expected and ignored.
fn forget_writeback_errors(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => forget_writeback_errors(&path),
            Ok(t) if t.is_file() => {
                if let Ok(f) = File::open(&path) {
                    let _ = f.sync_data();
                }
            }
            _ => {}
        }
    }
}

/// Whether `path` holds `pattern`: its `*`-separated pieces, in order, anywhere.
fn path_matches(path: &str, pattern: &str) -> bool {
    let mut rest = path;
    for piece in pattern.split('*') {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_paths_match_substrings_and_stars() {
        assert!(path_matches("/data/pc-2/00000000000000000000.log", "/pc-2/"));
        assert!(path_matches("/data/pc-2/00000000000000000000.log", "/pc-2/*.log"));
        assert!(!path_matches("/data/pc-2/00000000000000000000.index", "/pc-2/*.log"));
        assert!(!path_matches("/data/pc-3/00000000000000000000.log", "/pc-2/*.log"));
        assert!(path_matches("/a", ""));
    }

    fn file_with(bytes: &[u8]) -> File {
        let f = tempfile_in_tmp();
        f.write_all_at(bytes, 0).unwrap();
        f
    }

    fn tempfile_in_tmp() -> File {
        let path = std::env::temp_dir().join(format!("cutfs-test-{}-{:?}", std::process::id(), Instant::now()));
        let f = OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn contents(f: &File) -> Vec<u8> {
        let mut buf = vec![0u8; f.metadata().unwrap().len() as usize];
        read_full(f, &mut buf, 0).unwrap();
        buf
    }

    #[test]
    fn a_cut_undoes_overwrites_truncations_and_appends_since_the_last_fsync() {
        let f = file_with(b"durable!");
        let mut undo = Undo { durable_len: 8, ..Undo::default() };
        // Overwrite the middle twice (the first old bytes are the ones kept), truncate
        // below the durable length, then grow past it.
        undo.save(&f, 2, 5).unwrap();
        f.write_all_at(b"XXX", 2).unwrap();
        undo.save(&f, 1, 6).unwrap();
        f.write_all_at(b"YYYYY", 1).unwrap();
        undo.save(&f, 4, u64::MAX).unwrap();
        f.set_len(4).unwrap();
        f.write_all_at(b"appended beyond", 4).unwrap();
        let dropped = undo.restore(&f, Tear::None, 4096, &mut Rng(1)).unwrap();
        assert_eq!(contents(&f), b"durable!");
        assert!(dropped >= 11, "{dropped}");
    }

    #[test]
    fn a_torn_cut_keeps_whole_blocks_of_the_unsynced_tail_at_most() {
        for seed in 0..50 {
            let f = file_with(&[7u8; 100]);
            let undo = Undo { durable_len: 100, ..Undo::default() };
            f.write_all_at(&[9u8; 1000], 100).unwrap();
            undo.restore(&f, Tear::Keep, 64, &mut Rng(seed)).unwrap();
            let got = contents(&f);
            let kept = got.len() - 100;
            assert!(got.len() >= 100 && (kept.is_multiple_of(64) || got.len() == 1100), "seed {seed}: {}", got.len());
            assert!(got[..100].iter().all(|&b| b == 7) && got[100..].iter().all(|&b| b == 9));
            let f = file_with(&[7u8; 100]);
            f.write_all_at(&[9u8; 1000], 100).unwrap();
            undo.restore(&f, Tear::Zero, 64, &mut Rng(seed)).unwrap();
            let got = contents(&f);
            assert!(got[..100].iter().all(|&b| b == 7) && got[100..].iter().all(|&b| b == 0), "seed {seed}");
        }
    }
}
