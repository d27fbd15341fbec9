//! Reading objects of the Job Site's own object store, fast.
//!
//! libgit2 hashes every object it reads whole again with collision-detecting SHA-1. For an
//! export that was most of the CPU: every exported blob is read once. Collision detection
//! belongs where objects *enter* a repository (`index-pack`, [`crate::integrate`] writing a
//! patch's blobs), and the canonical and integration repositories only receive objects that
//! way. This reader checks each object against its ID with plain SHA-1 (the CPU's SHA
//! instructions), which still stops damaged data. Worker repositories are untrusted and are
//! never read here: [`crate::bundle`] keeps libgit2's verification.
//!
//! What it reads: pack index version 2, packs version 2 and 3 (whole objects, offset deltas
//! and reference deltas, with a bounded cache of delta bases) and zlib loose objects, inflated
//! with zlib-rs. Everything else (alternates, other index versions, packs that vanished in a
//! concurrent repack, a base outside every pack) is reported as *not handled*, and the caller
//! reads the object with libgit2. Damaged data is an error naming the file and offset.
//!
//! Memory per object is bounded ([`ReadLimits`]). An object above
//! [`ReadLimits::stream_above`] (default [`STREAM_ABOVE`], 32 MiB) is not read into memory:
//! [`SourceReader::read_bounded`] describes it ([`LargeObject`]) and [`SourceReader::stream`]
//! hands it on in pieces of at most 1 MiB, hashing them as they come and checking the ID at
//! the end. A whole object, loose or packed, is inflated piece by piece; a deltified one is
//! produced by applying its delta to its base, and the base (a delta copies from anywhere in
//! it) is resolved in memory, up to [`ReadLimits::max_deltified`] (default [`MAX_DELTIFIED`],
//! 512 MiB, Git's `core.bigFileThreshold`, above which Git stores blobs whole) for it and
//! every object of its chain; a larger one is an error telling the user to repack.
//!
//! [`SourceObjects`] holds the pack indexes and is shared; each thread takes its own
//! [`SourceReader`] (file handles, inflate state, base cache).

use std::{
    collections::{HashMap, VecDeque},
    fs,
    io::{self, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    rc::Rc,
};

use git2::{ObjectType, Oid};
use sha1::{Digest, Sha1};
use zlib_rs::{Inflate, InflateFlush, Status};

/// Bytes of delta bases one reader keeps.
const BASE_CACHE_BYTES: usize = 32 << 20;
/// Longest delta chain followed (Git's default `pack.depth` is 50).
const MAX_CHAIN: usize = 10_000;
/// Largest read of compressed input at once.
const MAX_CHUNK: usize = 1 << 20;
/// Largest piece of a streamed object handed on at once.
const STREAM_CHUNK: usize = 1 << 20;
/// Compressed bytes read to find the header of a loose object too large to read whole; a
/// dynamic Huffman block header takes at most a few hundred.
const LOOSE_HEADER_PEEK: usize = 4096;

/// Default [`ReadLimits::stream_above`]: 32 MiB. Objects up to this size are read whole (fast
/// for the many small files of a tree); larger ones stream, so an export's memory no longer
/// grows with its largest file.
pub const STREAM_ABOVE: u64 = 32 << 20;
/// Default [`ReadLimits::max_deltified`]: 512 MiB, Git's default `core.bigFileThreshold`, above
/// which `git repack` and `git gc` store blobs whole, never as deltas.
pub const MAX_DELTIFIED: u64 = 512 << 20;

/// How much of one object a reader holds in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// An object larger than this is streamed ([`SourceReader::read_bounded`] returns
    /// [`Found::Large`]), not read into memory.
    pub stream_above: u64,
    /// Largest object resolved in memory as part of a delta chain: a delta base, or a
    /// deltified object up to `stream_above` (a larger one is streamed, only its base is held),
    /// and largest delta held. Larger is an error ([`SourceReadError::DeltaTooLarge`]).
    pub max_deltified: u64,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            stream_above: STREAM_ABOVE,
            max_deltified: MAX_DELTIFIED,
        }
    }
}

/// Whether `compressed` bytes of deflate can hold `size` bytes (deflate expands at most
/// 1032:1). A larger announced size is damage: refusing it avoids allocating for it.
fn can_hold(compressed: u64, size: usize) -> bool {
    size as u64 <= compressed.saturating_mul(1032).saturating_add(1024)
}

/// A damaged object store.
#[derive(Debug, thiserror::Error)]
pub enum SourceReadError {
    /// A file of the object store could not be read.
    #[error("failed to read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The data is not what Git writes.
    #[error(
        "the object store is damaged: {path} at offset {offset}: {reason}; run `git fsck` on the source repository"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset in it.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A deltified object (or its base) is larger than the reader resolves in memory.
    #[error(
        "unable to read the object at {path} offset {offset}: it is stored as a delta of a {size}-byte object, over the {limit}-byte bound for deltified objects, which are resolved in memory; repack the source repository with `git repack -a -d -f` (at the default core.bigFileThreshold of 512 MiB, Git stores larger blobs whole, which are streamed)"
    )]
    DeltaTooLarge {
        /// The pack.
        path: PathBuf,
        /// Offset of the entry.
        offset: u64,
        /// Size of the object (or base, or delta).
        size: u64,
        /// [`ReadLimits::max_deltified`].
        limit: u64,
    },
}

/// An object read from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceObject {
    /// Its type.
    pub kind: ObjectType,
    /// Its content.
    pub data: Vec<u8>,
}

impl SourceObject {
    /// Whether the object hashes to `id`. Plain SHA-1 (with the CPU's SHA instructions): it
    /// catches damage; collisions were ruled out when the object entered the repository.
    fn has_id(&self, id: Oid) -> bool {
        let mut hasher = Sha1::new();
        hasher.update(format!("{} {}\0", self.kind.str(), self.data.len()).as_bytes());
        hasher.update(&self.data);
        hasher.finalize().as_slice() == id.as_bytes()
    }
}

/// What [`SourceReader::read_bounded`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Read into memory and checked against its ID.
    Loaded(SourceObject),
    /// An object above [`ReadLimits::stream_above`]; read it with [`SourceReader::stream`].
    Large(LargeObject),
}

/// An object too large to read into memory: its type, its size and where it is. Any reader of
/// the same [`SourceObjects`] can [`stream`](SourceReader::stream) it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargeObject {
    /// Its type.
    pub kind: ObjectType,
    /// Its size in bytes, as the store announces it (checked while streaming).
    pub size: u64,
    at: LargeAt,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LargeAt {
    /// A loose object file whose inflated header is `header_len` bytes.
    Loose { path: PathBuf, header_len: u64 },
    /// A whole entry of pack `pack` at `entry_at`, its zlib stream at `data_at`.
    Packed {
        pack: usize,
        entry_at: u64,
        data_at: u64,
    },
    /// A delta entry of pack `pack` at `entry_at` with a large result: its base is resolved
    /// in memory, the result is streamed as the delta is applied.
    Delta { pack: usize, entry_at: u64 },
}

/// Why streaming an object stopped.
enum StreamFailure<E> {
    /// The zlib stream is damaged at this offset from its start.
    Data { at: u64, reason: String },
    /// Reading the store failed.
    Io(io::Error),
    /// The sink refused a piece.
    Sink(E),
}

/// The pack indexes of one object store (shared by every reader).
#[derive(Debug)]
pub struct SourceObjects {
    objects_dir: PathBuf,
    packs: Vec<PackIndex>,
}

#[derive(Debug)]
struct PackIndex {
    pack_path: PathBuf,
    /// The whole `.idx` file.
    data: Vec<u8>,
    count: usize,
}

const IDX_MAGIC: [u8; 4] = [0xff, b't', b'O', b'c'];
const IDX_HEADER: usize = 8;
const FANOUT: usize = 256 * 4;

impl PackIndex {
    /// Parses a version-2 index; `None` for any other version (left to libgit2).
    fn parse(
        pack_path: PathBuf,
        data: Vec<u8>,
        idx_path: &Path,
    ) -> Result<Option<Self>, SourceReadError> {
        if data.len() < IDX_HEADER + FANOUT || data[..4] != IDX_MAGIC || be32(&data, 4) != Some(2) {
            return Ok(None);
        }
        let corrupt = |reason: &str| SourceReadError::Corrupt {
            path: idx_path.to_owned(),
            offset: 0,
            reason: reason.to_owned(),
        };
        let mut previous = 0;
        for slot in 0..256 {
            let value = be32(&data, IDX_HEADER + slot * 4).unwrap_or(0);
            if value < previous {
                return Err(corrupt("the fan-out table is not monotonic"));
            }
            previous = value;
        }
        let count = previous as usize;
        // Names, CRCs and 32-bit offsets, then the two checksums.
        if data.len() < IDX_HEADER + FANOUT + count * 28 + 40 {
            return Err(corrupt("the index is shorter than its object count"));
        }
        Ok(Some(Self {
            pack_path,
            data,
            count,
        }))
    }

    fn fanout(&self, slot: usize) -> usize {
        be32(&self.data, IDX_HEADER + slot * 4).unwrap_or(0) as usize
    }

    /// Offset of `id` in the pack, if the pack holds it.
    fn find(&self, id: &[u8]) -> Option<u64> {
        let first = usize::from(*id.first()?);
        let mut low = if first == 0 {
            0
        } else {
            self.fanout(first - 1)
        };
        let mut high = self.fanout(first);
        let names = IDX_HEADER + FANOUT;
        while low < high {
            let middle = low + (high - low) / 2;
            let name = self
                .data
                .get(names + middle * 20..names + middle * 20 + 20)?;
            match name.cmp(id) {
                std::cmp::Ordering::Equal => return self.offset(middle),
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
            }
        }
        None
    }

    fn offset(&self, position: usize) -> Option<u64> {
        let offsets = IDX_HEADER + FANOUT + self.count * 24;
        let small = be32(&self.data, offsets + position * 4)?;
        if small & 0x8000_0000 == 0 {
            return Some(u64::from(small));
        }
        let large = offsets + self.count * 4 + (small & 0x7fff_ffff) as usize * 8;
        let bytes = self.data.get(large..large + 8)?;
        Some(u64::from_be_bytes(bytes.try_into().ok()?))
    }
}

fn be32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

impl SourceObjects {
    /// Reads the pack indexes under `objects_dir` (`<git dir>/objects`).
    pub fn open(objects_dir: &Path) -> Result<Self, SourceReadError> {
        let pack_dir = objects_dir.join("pack");
        let mut packs = Vec::new();
        let entries = match fs::read_dir(&pack_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Self {
                    objects_dir: objects_dir.to_owned(),
                    packs,
                });
            }
            Err(source) => {
                return Err(SourceReadError::Io {
                    path: pack_dir,
                    source,
                });
            }
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| SourceReadError::Io {
                path: pack_dir.clone(),
                source,
            })?;
            let name = entry.file_name();
            if let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".idx")) {
                names.push(stem.to_owned());
            }
        }
        // Newest-first is what Git prefers; any fixed order gives the same objects.
        names.sort();
        for stem in names {
            let idx_path = pack_dir.join(format!("{stem}.idx"));
            let pack_path = pack_dir.join(format!("{stem}.pack"));
            let data = match fs::read(&idx_path) {
                Ok(data) => data,
                // Removed by a concurrent repack: its objects are in the new pack.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(SourceReadError::Io {
                        path: idx_path,
                        source,
                    });
                }
            };
            if let Some(index) = PackIndex::parse(pack_path, data, &idx_path)? {
                packs.push(index);
            }
        }
        Ok(Self {
            objects_dir: objects_dir.to_owned(),
            packs,
        })
    }

    /// A reader for one thread, with the default [`ReadLimits`].
    pub fn reader(&self) -> SourceReader<'_> {
        self.reader_with(ReadLimits::default())
    }

    /// A reader for one thread that holds at most `limits` of an object in memory.
    pub fn reader_with(&self, limits: ReadLimits) -> SourceReader<'_> {
        SourceReader {
            store: self,
            limits,
            files: (0..self.packs.len()).map(|_| None).collect(),
            inflate: Inflate::new(true, 15),
            input: Vec::new(),
            bases: BaseCache::default(),
        }
    }

    fn locate(&self, id: &[u8]) -> Option<(usize, u64)> {
        self.packs
            .iter()
            .enumerate()
            .find_map(|(pack, index)| index.find(id).map(|offset| (pack, offset)))
    }
}

/// Reads objects of a [`SourceObjects`] store; one per thread.
pub struct SourceReader<'a> {
    store: &'a SourceObjects,
    limits: ReadLimits,
    files: Vec<Option<(fs::File, u64)>>,
    inflate: Inflate,
    input: Vec<u8>,
    bases: BaseCache,
}

/// Where an entry is: (pack, offset).
type EntryAt = (usize, u64);
/// A resolved object, shared between the cache and a chain being applied.
type Resolved = (ObjectType, Rc<Vec<u8>>);

/// Delta bases by (pack, offset), oldest evicted first.
#[derive(Default)]
struct BaseCache {
    entries: HashMap<EntryAt, Resolved>,
    order: VecDeque<EntryAt>,
    bytes: usize,
}

impl BaseCache {
    fn get(&self, key: EntryAt) -> Option<Resolved> {
        self.entries.get(&key).cloned()
    }

    fn insert(&mut self, key: EntryAt, kind: ObjectType, data: Rc<Vec<u8>>) {
        if data.len() > BASE_CACHE_BYTES / 4 || self.entries.contains_key(&key) {
            return;
        }
        self.bytes += data.len();
        self.entries.insert(key, (kind, data));
        self.order.push_back(key);
        while self.bytes > BASE_CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, data)) = self.entries.remove(&old) {
                self.bytes -= data.len();
            }
        }
    }
}

/// One entry's header in a pack.
enum EntryHeader {
    Whole {
        kind: ObjectType,
        size: usize,
        data_at: u64,
    },
    OffsetDelta {
        size: usize,
        data_at: u64,
        base_at: u64,
    },
    RefDelta {
        size: usize,
        data_at: u64,
        base: [u8; 20],
    },
}

impl SourceReader<'_> {
    /// Reads object `id` into memory, whatever its size (a large object is streamed into one
    /// buffer). `Ok(None)`: this reader does not handle where the object is (read it
    /// with libgit2).
    pub fn read(&mut self, id: Oid) -> Result<Option<SourceObject>, SourceReadError> {
        match self.read_bounded(id)? {
            None => Ok(None),
            Some(Found::Loaded(object)) => Ok(Some(object)),
            Some(Found::Large(large)) => {
                let mut data = Vec::new();
                self.stream(id, &large, |piece| {
                    data.extend_from_slice(piece);
                    Ok::<_, SourceReadError>(())
                })?;
                Ok(Some(SourceObject {
                    kind: large.kind,
                    data,
                }))
            }
        }
    }

    /// Reads object `id` into memory, or, for an object above [`ReadLimits::stream_above`],
    /// only finds it ([`Found::Large`]: read it with
    /// [`SourceReader::stream`]). `Ok(None)`: this reader does not handle where the object is
    /// (read it with libgit2).
    pub fn read_bounded(&mut self, id: Oid) -> Result<Option<Found>, SourceReadError> {
        if let Some((pack, offset)) = self.store.locate(id.as_bytes()) {
            let found = self.read_packed(pack, offset)?;
            if let Some(Found::Loaded(object)) = &found
                && !object.has_id(id)
            {
                return Err(self.corrupt(
                    pack,
                    offset,
                    "the object's content does not hash to its ID",
                ));
            }
            return Ok(found);
        }
        self.read_loose(id)
    }

    /// Inflates large object `id` (found by [`SourceReader::read_bounded`] of any reader of
    /// this store) and hands its content to `sink` in pieces of at most 1 MiB, in order. The
    /// content is hashed as it goes: when it does not hash to `id`, or the data is damaged,
    /// the error comes after some pieces were handed on, so the caller must discard what the
    /// sink received. An error of `sink` stops the stream and is returned.
    pub fn stream<E: From<SourceReadError>>(
        &mut self,
        id: Oid,
        large: &LargeObject,
        mut sink: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut hasher = Sha1::new();
        hasher.update(format!("{} {}\0", large.kind.str(), large.size).as_bytes());
        let (path, offset, result) = match &large.at {
            LargeAt::Loose { path, header_len } => {
                let mut file = fs::File::open(path).map_err(|source| SourceReadError::Io {
                    path: path.clone(),
                    source,
                })?;
                // The header was parsed by read_bounded; the ID covers it through `hasher`.
                let mut skip = *header_len;
                let result = inflate_stream(
                    &mut self.inflate,
                    &mut file,
                    header_len.saturating_add(large.size),
                    |mut piece| {
                        let skipped = usize::try_from(skip).unwrap_or(usize::MAX).min(piece.len());
                        skip -= skipped as u64;
                        piece = &piece[skipped..];
                        if piece.is_empty() {
                            return Ok(());
                        }
                        hasher.update(piece);
                        sink(piece)
                    },
                );
                (path.clone(), 0, result)
            }
            LargeAt::Packed {
                pack,
                entry_at,
                data_at,
            } => {
                let (pack, entry_at, data_at) = (*pack, *entry_at, *data_at);
                let path = self.store.packs[pack].pack_path.clone();
                let io_error = |source| SourceReadError::Io {
                    path: path.clone(),
                    source,
                };
                if self.file(pack)?.is_none() {
                    return Err(self
                        .corrupt(pack, entry_at, "the pack vanished while it was read")
                        .into());
                }
                let Some((file, _)) = self.files[pack].as_mut() else {
                    return Err(self
                        .corrupt(pack, entry_at, "the pack vanished while it was read")
                        .into());
                };
                file.seek(SeekFrom::Start(data_at)).map_err(io_error)?;
                let result = inflate_stream(&mut self.inflate, file, large.size, |piece| {
                    hasher.update(piece);
                    sink(piece)
                });
                (path, data_at, result)
            }
            LargeAt::Delta { pack, entry_at } => {
                let (pack, entry_at) = (*pack, *entry_at);
                let path = self.store.packs[pack].pack_path.clone();
                let result = self.stream_delta(pack, entry_at, large, |piece| {
                    hasher.update(piece);
                    sink(piece)
                })?;
                (path, entry_at, result)
            }
        };
        let entry_at = match &large.at {
            LargeAt::Loose { .. } => 0,
            LargeAt::Packed { entry_at, .. } | LargeAt::Delta { entry_at, .. } => *entry_at,
        };
        match result {
            Ok(()) => {}
            Err(StreamFailure::Sink(e)) => return Err(e),
            Err(StreamFailure::Io(source)) => {
                return Err(SourceReadError::Io { path, source }.into());
            }
            Err(StreamFailure::Data { at, reason }) => {
                return Err(SourceReadError::Corrupt {
                    path,
                    offset: offset + at,
                    reason,
                }
                .into());
            }
        }
        if hasher.finalize().as_slice() != id.as_bytes() {
            return Err(SourceReadError::Corrupt {
                path,
                offset: entry_at,
                reason: "the object's content does not hash to its ID".to_owned(),
            }
            .into());
        }
        Ok(())
    }

    /// Resolves the base of the delta at `entry_at` of `pack` in memory and applies the delta
    /// to it, handing the result to `emit` in pieces of [`STREAM_CHUNK`] bytes (the last may
    /// be shorter). A damaged delta is a [`StreamFailure::Data`] at offset 0 from the entry.
    fn stream_delta<E>(
        &mut self,
        pack: usize,
        entry_at: u64,
        large: &LargeObject,
        mut emit: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<Result<(), StreamFailure<E>>, SourceReadError> {
        let vanished = |reader: &Self| {
            reader.corrupt(
                pack,
                entry_at,
                "the delta's base vanished while it was read",
            )
        };
        let (size, data_at, base) = match self.entry_header(pack, entry_at)? {
            Some(EntryHeader::OffsetDelta {
                size,
                data_at,
                base_at,
            }) => (size, data_at, (pack, base_at)),
            Some(EntryHeader::RefDelta {
                size,
                data_at,
                base,
            }) => match self.store.locate(&base) {
                Some(location) => (size, data_at, location),
                None => return Err(vanished(self)),
            },
            _ => return Err(vanished(self)),
        };
        self.check_delta_size(size, pack, entry_at)?;
        let delta = self.inflate_at(pack, data_at, size)?;
        let base = match self.resolve(base.0, base.1, false)? {
            Some(Found::Loaded(base)) if base.kind == large.kind => base,
            Some(Found::Loaded(_)) => {
                return Err(self.corrupt(pack, entry_at, "the delta's base changed type"));
            }
            _ => return Err(vanished(self)),
        };
        if delta_target(&delta).ok() != usize::try_from(large.size).ok() {
            return Err(self.corrupt(pack, entry_at, "the delta changed while it was read"));
        }
        let mut pending: Vec<u8> = Vec::with_capacity(STREAM_CHUNK);
        let applied = apply_delta_into(&base.data, &delta, |mut piece| {
            while !piece.is_empty() {
                let take = (STREAM_CHUNK - pending.len()).min(piece.len());
                pending.extend_from_slice(&piece[..take]);
                piece = &piece[take..];
                if pending.len() == STREAM_CHUNK {
                    emit(&pending)?;
                    pending.clear();
                }
            }
            Ok(())
        });
        let result = match applied {
            Ok(()) if pending.is_empty() => Ok(()),
            Ok(()) => emit(&pending).map_err(StreamFailure::Sink),
            Err(DeltaFailure::Sink(e)) => Err(StreamFailure::Sink(e)),
            Err(DeltaFailure::Bad(reason)) => Err(StreamFailure::Data {
                at: 0,
                reason: reason.to_owned(),
            }),
        };
        Ok(result)
    }

    fn read_loose(&mut self, id: Oid) -> Result<Option<Found>, SourceReadError> {
        let hex = id.to_string();
        let path = self.store.objects_dir.join(&hex[..2]).join(&hex[2..]);
        let io_error = |source| SourceReadError::Io {
            path: path.clone(),
            source,
        };
        let mut file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_error(source)),
        };
        let len = file.metadata().map_err(io_error)?.len();
        // A file small enough is read whole; of a larger one only enough to parse the header,
        // and the object is streamed whatever size it announces.
        let whole = len <= self.limits.stream_above;
        let mut compressed = Vec::new();
        let wanted = if whole { len } else { LOOSE_HEADER_PEEK as u64 };
        (&mut file)
            .take(wanted)
            .read_to_end(&mut compressed)
            .map_err(io_error)?;
        // A zlib header (CMF/FLG check); anything else is the ancient "pack-like" format.
        let zlib = compressed.len() >= 2
            && compressed[0] & 0x8f == 0x08
            && (u16::from(compressed[0]) << 8 | u16::from(compressed[1])) % 31 == 0;
        if !zlib {
            return Ok(None);
        }
        let stream_above = if whole { self.limits.stream_above } else { 0 };
        let decoded = decode_loose(&mut self.inflate, &compressed, len, stream_above).map_err(
            |(offset, reason)| SourceReadError::Corrupt {
                path: path.clone(),
                offset,
                reason,
            },
        )?;
        let object = match decoded {
            Loose::Object(object) => object,
            Loose::Large {
                kind,
                size,
                header_len,
            } => {
                return Ok(Some(Found::Large(LargeObject {
                    kind,
                    size,
                    at: LargeAt::Loose { path, header_len },
                })));
            }
        };
        if !object.has_id(id) {
            return Err(SourceReadError::Corrupt {
                path,
                offset: 0,
                reason: "the object's content does not hash to its ID".to_owned(),
            });
        }
        Ok(Some(Found::Loaded(object)))
    }

    fn read_packed(&mut self, pack: usize, offset: u64) -> Result<Option<Found>, SourceReadError> {
        self.resolve(pack, offset, true)
    }

    /// Resolves the entry at `offset` of `pack`; with `stream_top`, an entry whose object is
    /// above [`ReadLimits::stream_above`] is only found ([`Found::Large`]).
    fn resolve(
        &mut self,
        pack: usize,
        offset: u64,
        stream_top: bool,
    ) -> Result<Option<Found>, SourceReadError> {
        // Follow the chain down to a whole object or a cached base, then apply the deltas.
        let mut chain: Vec<(EntryAt, Vec<u8>)> = Vec::new();
        let (mut pack, mut at) = (pack, offset);
        let (kind, mut data) = loop {
            if chain.len() > MAX_CHAIN {
                return Err(self.corrupt(pack, at, "the delta chain is longer than 10000"));
            }
            // A cached object above the limit asked for itself is streamed all the same.
            if let Some(base) = self.bases.get((pack, at))
                && !(stream_top
                    && chain.is_empty()
                    && base.1.len() as u64 > self.limits.stream_above)
            {
                break base;
            }
            let Some(header) = self.entry_header(pack, at)? else {
                return Ok(None);
            };
            match header {
                EntryHeader::Whole {
                    kind,
                    size,
                    data_at,
                } => {
                    if stream_top && chain.is_empty() && size as u64 > self.limits.stream_above {
                        return Ok(Some(Found::Large(LargeObject {
                            kind,
                            size: size as u64,
                            at: LargeAt::Packed {
                                pack,
                                entry_at: at,
                                data_at,
                            },
                        })));
                    }
                    self.check_delta_size(size, pack, at)?;
                    let data = self.inflate_at(pack, data_at, size)?;
                    break (kind, Rc::new(data));
                }
                EntryHeader::OffsetDelta {
                    size,
                    data_at,
                    base_at,
                } => {
                    self.check_delta_size(size, pack, at)?;
                    let delta = self.inflate_at(pack, data_at, size)?;
                    if stream_top
                        && chain.is_empty()
                        && let Some(large) = self.large_delta(&delta, pack, at)?
                    {
                        return Ok(Some(large));
                    }
                    self.check_delta_target(&delta, pack, at)?;
                    chain.push(((pack, at), delta));
                    at = base_at;
                }
                EntryHeader::RefDelta {
                    size,
                    data_at,
                    base,
                } => {
                    self.check_delta_size(size, pack, at)?;
                    let delta = self.inflate_at(pack, data_at, size)?;
                    if stream_top
                        && chain.is_empty()
                        && let Some(large) = self.large_delta(&delta, pack, at)?
                    {
                        return Ok(Some(large));
                    }
                    self.check_delta_target(&delta, pack, at)?;
                    chain.push(((pack, at), delta));
                    let Some(location) = self.store.locate(&base) else {
                        return Ok(None);
                    };
                    (pack, at) = location;
                }
            }
        };
        let mut base_at = (pack, at);
        for (entry_at, delta) in chain.into_iter().rev() {
            self.bases.insert(base_at, kind, Rc::clone(&data));
            let applied = apply_delta(&data, &delta)
                .map_err(|reason| self.corrupt(entry_at.0, entry_at.1, reason))?;
            data = Rc::new(applied);
            base_at = entry_at;
        }
        let data = Rc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone());
        Ok(Some(Found::Loaded(SourceObject { kind, data })))
    }

    /// The top delta of a chain (entry at `at` of `pack`) whose result is above
    /// [`ReadLimits::stream_above`], as a [`Found::Large`] of the type at the bottom of its
    /// chain (`None` when the chain leaves this store); `Ok(None)` too for a smaller result.
    fn large_delta(
        &mut self,
        delta: &[u8],
        pack: usize,
        at: u64,
    ) -> Result<Option<Found>, SourceReadError> {
        let target = delta_target(delta).map_err(|reason| self.corrupt(pack, at, reason))?;
        if target as u64 <= self.limits.stream_above {
            return Ok(None);
        }
        // The chain's headers only, down to the whole object that gives the type.
        let (mut base_pack, mut base_at) = (pack, at);
        for _ in 0..=MAX_CHAIN {
            if let Some((kind, _)) = self.bases.get((base_pack, base_at)) {
                return Ok(Some(self.large_delta_of(kind, target, pack, at)));
            }
            let Some(header) = self.entry_header(base_pack, base_at)? else {
                return Ok(None);
            };
            match header {
                EntryHeader::Whole { kind, .. } => {
                    return Ok(Some(self.large_delta_of(kind, target, pack, at)));
                }
                EntryHeader::OffsetDelta { base_at: next, .. } => base_at = next,
                EntryHeader::RefDelta { base, .. } => {
                    let Some(location) = self.store.locate(&base) else {
                        return Ok(None);
                    };
                    (base_pack, base_at) = location;
                }
            }
        }
        Err(self.corrupt(pack, at, "the delta chain is longer than 10000"))
    }

    fn large_delta_of(&self, kind: ObjectType, size: usize, pack: usize, at: u64) -> Found {
        Found::Large(LargeObject {
            kind,
            size: size as u64,
            at: LargeAt::Delta { pack, entry_at: at },
        })
    }

    /// Refuses `size` bytes of an object in a delta chain (entry at `at` of `pack`) — a base,
    /// a delta held in memory, or a delta's result — over [`ReadLimits::max_deltified`],
    /// before inflating it.
    fn check_delta_size(&self, size: usize, pack: usize, at: u64) -> Result<(), SourceReadError> {
        if size as u64 > self.limits.max_deltified {
            return Err(SourceReadError::DeltaTooLarge {
                path: self.store.packs[pack].pack_path.clone(),
                offset: at,
                size: size as u64,
                limit: self.limits.max_deltified,
            });
        }
        Ok(())
    }

    /// Refuses a delta (entry at `at` of `pack`) whose result is over
    /// [`ReadLimits::max_deltified`] before resolving it.
    fn check_delta_target(
        &self,
        delta: &[u8],
        pack: usize,
        at: u64,
    ) -> Result<(), SourceReadError> {
        let target = delta_target(delta).map_err(|reason| self.corrupt(pack, at, reason))?;
        self.check_delta_size(target, pack, at)
    }

    fn corrupt(&self, pack: usize, offset: u64, reason: &str) -> SourceReadError {
        SourceReadError::Corrupt {
            path: self.store.packs[pack].pack_path.clone(),
            offset,
            reason: reason.to_owned(),
        }
    }

    /// The open pack file and its length; `None` when it is gone (a concurrent repack).
    fn file(&mut self, pack: usize) -> Result<Option<&mut (fs::File, u64)>, SourceReadError> {
        if self.files[pack].is_none() {
            let path = &self.store.packs[pack].pack_path;
            let mut file = match fs::File::open(path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(source) => {
                    return Err(SourceReadError::Io {
                        path: path.clone(),
                        source,
                    });
                }
            };
            let mut header = [0u8; 8];
            file.read_exact(&mut header)
                .map_err(|source| SourceReadError::Io {
                    path: path.clone(),
                    source,
                })?;
            let version = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            if &header[..4] != b"PACK" || !(version == 2 || version == 3) {
                return Err(self.corrupt(pack, 0, "not a version 2 or 3 pack"));
            }
            let len = file
                .metadata()
                .map_err(|source| SourceReadError::Io {
                    path: path.clone(),
                    source,
                })?
                .len();
            self.files[pack] = Some((file, len));
        }
        Ok(self.files[pack].as_mut())
    }

    /// Reads up to `len` bytes at `offset` into `self.input`.
    fn fill(&mut self, pack: usize, offset: u64, len: usize) -> Result<bool, SourceReadError> {
        let path = &self.store.packs[pack].pack_path;
        let io_error = |source| SourceReadError::Io {
            path: path.clone(),
            source,
        };
        let Some((file, _)) = self.files[pack].as_mut() else {
            return Ok(false);
        };
        file.seek(SeekFrom::Start(offset)).map_err(io_error)?;
        self.input.clear();
        file.take(len as u64)
            .read_to_end(&mut self.input)
            .map_err(io_error)?;
        Ok(true)
    }

    fn entry_header(
        &mut self,
        pack: usize,
        at: u64,
    ) -> Result<Option<EntryHeader>, SourceReadError> {
        if self.file(pack)?.is_none() || !self.fill(pack, at, 32)? {
            return Ok(None);
        }
        parse_entry_header(&self.input, at)
            .map(Some)
            .map_err(|reason| self.corrupt(pack, at, reason))
    }

    /// Inflates the zlib stream at `at` that must hold exactly `size` bytes.
    fn inflate_at(
        &mut self,
        pack: usize,
        at: u64,
        size: usize,
    ) -> Result<Vec<u8>, SourceReadError> {
        let available = self.files[pack]
            .as_ref()
            .map_or(0, |(_, len)| len.saturating_sub(at));
        if !can_hold(available, size) {
            return Err(self.corrupt(
                pack,
                at,
                &format!(
                    "the entry announces {size} bytes, more than the rest of the pack can hold"
                ),
            ));
        }
        // One spare byte: a stream longer than announced is caught, and the inflater always
        // has room to reach the end of the stream (its checksum) after the last byte.
        let mut out = vec![0u8; size + 1];
        let mut written = 0usize;
        let mut position = at;
        let mut chunk = (size + 64).clamp(256, MAX_CHUNK);
        self.inflate.reset(true);
        loop {
            if !self.fill(pack, position, chunk)? {
                return Err(self.corrupt(pack, at, "the pack vanished while it was read"));
            }
            if self.input.is_empty() {
                return Err(self.corrupt(pack, at, "the object runs past the end of the pack"));
            }
            let (in_before, out_before) = (self.inflate.total_in(), self.inflate.total_out());
            let status =
                self.inflate
                    .decompress(&self.input, &mut out[written..], InflateFlush::NoFlush);
            let consumed = (self.inflate.total_in() - in_before) as usize;
            let produced = (self.inflate.total_out() - out_before) as usize;
            written += produced;
            position += consumed as u64;
            match status {
                Ok(Status::StreamEnd) => break,
                Ok(_) if consumed > 0 || produced > 0 => {}
                Ok(_) => return Err(self.corrupt(pack, at, "the compressed stream is truncated")),
                Err(e) => return Err(self.corrupt(pack, at, e.as_str())),
            }
            if written > size {
                break;
            }
            chunk = MAX_CHUNK;
        }
        if written != size {
            return Err(self.corrupt(
                pack,
                at,
                &format!("the entry announced {size} bytes but holds {written}"),
            ));
        }
        out.truncate(size);
        Ok(out)
    }
}

fn object_type(code: u8) -> Option<ObjectType> {
    match code {
        1 => Some(ObjectType::Commit),
        2 => Some(ObjectType::Tree),
        3 => Some(ObjectType::Blob),
        4 => Some(ObjectType::Tag),
        _ => None,
    }
}

/// A cursor over the bytes of a header.
struct Cursor<'a> {
    bytes: &'a [u8],
    used: usize,
}

impl Cursor<'_> {
    fn next(&mut self) -> Result<u8, &'static str> {
        let byte = *self.bytes.get(self.used).ok_or("the header is truncated")?;
        self.used += 1;
        Ok(byte)
    }

    /// A little-endian base-128 size (delta sizes).
    fn size(&mut self) -> Result<usize, &'static str> {
        let (mut size, mut shift) = (0u64, 0);
        loop {
            let byte = self.next()?;
            if shift > 63 {
                return Err("a size does not fit in 64 bits");
            }
            size |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                return usize::try_from(size).map_err(|_| "a size is too large for this machine");
            }
        }
    }
}

/// Parses a pack entry header (type and size, then the delta base) from `bytes`, the start of
/// the entry at pack offset `at`.
fn parse_entry_header(bytes: &[u8], at: u64) -> Result<EntryHeader, &'static str> {
    let mut cursor = Cursor { bytes, used: 0 };
    let mut byte = cursor.next()?;
    let code = (byte >> 4) & 0x07;
    let mut size = u64::from(byte & 0x0f);
    let mut shift = 4;
    while byte & 0x80 != 0 {
        byte = cursor.next()?;
        if shift > 57 {
            return Err("the entry size does not fit in 64 bits");
        }
        size |= u64::from(byte & 0x7f) << shift;
        shift += 7;
    }
    let size = usize::try_from(size).map_err(|_| "the entry is too large for this machine")?;
    match code {
        6 => {
            // Big-endian base-128 with an offset added per continuation byte.
            let mut byte = cursor.next()?;
            let mut distance = u64::from(byte & 0x7f);
            while byte & 0x80 != 0 {
                byte = cursor.next()?;
                distance = distance
                    .checked_add(1)
                    .and_then(|d| d.checked_mul(128))
                    .ok_or("the delta base offset overflows")?
                    | u64::from(byte & 0x7f);
            }
            if distance == 0 || distance > at {
                return Err("the delta base offset points outside the pack");
            }
            Ok(EntryHeader::OffsetDelta {
                size,
                data_at: at + cursor.used as u64,
                base_at: at - distance,
            })
        }
        7 => {
            let mut base = [0u8; 20];
            for slot in &mut base {
                *slot = cursor.next()?;
            }
            Ok(EntryHeader::RefDelta {
                size,
                data_at: at + cursor.used as u64,
                base,
            })
        }
        code => Ok(EntryHeader::Whole {
            kind: object_type(code).ok_or("unknown object type")?,
            size,
            data_at: at + cursor.used as u64,
        }),
    }
}

/// The target size a delta announces.
fn delta_target(delta: &[u8]) -> Result<usize, &'static str> {
    let mut cursor = Cursor {
        bytes: delta,
        used: 0,
    };
    cursor.size().and_then(|_| cursor.size())
}

/// Why applying a delta stopped.
enum DeltaFailure<E> {
    /// The delta is not what Git writes.
    Bad(&'static str),
    /// The sink refused a piece.
    Sink(E),
}

/// Applies a Git delta (source size, target size, then copy and insert instructions) to
/// `base`.
fn apply_delta(base: &[u8], delta: &[u8]) -> Result<Vec<u8>, &'static str> {
    let target = delta_target(delta)?;
    // The target size is data; do not trust it for one huge allocation.
    let mut out = Vec::with_capacity(target.min(base.len() + delta.len()));
    apply_delta_into(base, delta, |piece| {
        out.extend_from_slice(piece);
        Ok::<_, std::convert::Infallible>(())
    })
    .map_err(|failure| match failure {
        DeltaFailure::Bad(reason) => reason,
        DeltaFailure::Sink(never) => match never {},
    })?;
    Ok(out)
}

/// Applies a Git delta to `base`, handing the result to `push` in the pieces its copy and
/// insert instructions make, never more than the target size it announces. Holds nothing.
fn apply_delta_into<E>(
    base: &[u8],
    delta: &[u8],
    mut push: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), DeltaFailure<E>> {
    let mut cursor = Cursor {
        bytes: delta,
        used: 0,
    };
    if cursor.size().map_err(DeltaFailure::Bad)? != base.len() {
        return Err(DeltaFailure::Bad(
            "the delta's source size is not its base's size",
        ));
    }
    let target = cursor.size().map_err(DeltaFailure::Bad)?;
    let mut written = 0usize;
    while cursor.used < delta.len() {
        let command = cursor.next().map_err(DeltaFailure::Bad)?;
        let piece = if command & 0x80 != 0 {
            let mut offset = 0usize;
            for bit in 0..4 {
                if command & (1 << bit) != 0 {
                    offset |= usize::from(cursor.next().map_err(DeltaFailure::Bad)?) << (8 * bit);
                }
            }
            let mut len = 0usize;
            for bit in 0..3 {
                if command & (0x10 << bit) != 0 {
                    len |= usize::from(cursor.next().map_err(DeltaFailure::Bad)?) << (8 * bit);
                }
            }
            if len == 0 {
                len = 0x1_0000;
            }
            offset
                .checked_add(len)
                .and_then(|end| base.get(offset..end))
                .ok_or(DeltaFailure::Bad("a delta copy reads past its base"))?
        } else if command != 0 {
            let len = usize::from(command);
            let inserted = delta
                .get(cursor.used..cursor.used + len)
                .ok_or(DeltaFailure::Bad("a delta insert runs past the delta"))?;
            cursor.used += len;
            inserted
        } else {
            return Err(DeltaFailure::Bad(
                "the delta uses the reserved instruction 0",
            ));
        };
        written += piece.len();
        if written > target {
            return Err(DeltaFailure::Bad(
                "the delta writes more than its target size",
            ));
        }
        push(piece).map_err(DeltaFailure::Sink)?;
    }
    if written != target {
        return Err(DeltaFailure::Bad(
            "the delta writes less than its target size",
        ));
    }
    Ok(())
}

/// A decoded loose object file.
#[derive(Debug)]
enum Loose {
    Object(SourceObject),
    /// Larger than the caller reads into memory: the content is not inflated.
    Large {
        kind: ObjectType,
        size: u64,
        /// Bytes of `"<type> <size>\0"`.
        header_len: u64,
    },
}

/// Decodes a loose object file (zlib of `"<type> <size>\0" ‖ content`) whose first bytes are
/// `compressed` (all of it unless `file_len` is larger); an object announcing more than
/// `stream_above` bytes, or one not given whole, is only described ([`Loose::Large`]).
/// Errors carry the offset in the compressed file.
fn decode_loose(
    inflate: &mut Inflate,
    compressed: &[u8],
    file_len: u64,
    stream_above: u64,
) -> Result<Loose, (u64, String)> {
    inflate.reset(true);
    let mut head = [0u8; 64];
    let status = inflate
        .decompress(compressed, &mut head, InflateFlush::NoFlush)
        .map_err(|e| (inflate.total_in(), e.as_str().to_owned()))?;
    let produced = inflate.total_out() as usize;
    let nul = head[..produced]
        .iter()
        .position(|b| *b == 0)
        .ok_or((0, "no object header".to_owned()))?;
    let header = std::str::from_utf8(&head[..nul])
        .map_err(|_| (0, "the object header is not text".to_owned()))?;
    let (kind, size) = header
        .split_once(' ')
        .ok_or((0, format!("malformed object header `{header}`")))?;
    let kind = match ObjectType::from_str(kind) {
        Some(
            kind @ (ObjectType::Commit | ObjectType::Tree | ObjectType::Blob | ObjectType::Tag),
        ) => kind,
        _ => return Err((0, format!("unknown object type `{kind}`"))),
    };
    let size: usize = size
        .parse()
        .map_err(|_| (0, format!("malformed object size in `{header}`")))?;
    if !can_hold(file_len, size) {
        return Err((
            0,
            format!("the object announces {size} bytes, more than its file can hold"),
        ));
    }
    if size as u64 > stream_above || (compressed.len() as u64) < file_len {
        return Ok(Loose::Large {
            kind,
            size: size as u64,
            header_len: nul as u64 + 1,
        });
    }
    let prefix = &head[nul + 1..produced];
    if prefix.len() > size {
        return Err((
            0,
            format!("the object announced {size} bytes but holds more"),
        ));
    }
    // One spare byte, as for packed entries.
    let mut data = vec![0u8; size + 1];
    data[..prefix.len()].copy_from_slice(prefix);
    let mut written = prefix.len();
    let mut ended = status == Status::StreamEnd;
    while !ended {
        let consumed = inflate.total_in() as usize;
        let out_before = inflate.total_out();
        let status = inflate
            .decompress(
                &compressed[consumed..],
                &mut data[written..],
                InflateFlush::Finish,
            )
            .map_err(|e| (inflate.total_in(), e.as_str().to_owned()))?;
        let produced = (inflate.total_out() - out_before) as usize;
        written += produced;
        ended = status == Status::StreamEnd;
        if !ended && (produced == 0 && inflate.total_in() as usize == consumed || written > size) {
            return Err((
                inflate.total_in(),
                "the compressed stream is truncated".to_owned(),
            ));
        }
    }
    if written != size {
        return Err((
            inflate.total_in(),
            format!("the object announced {size} bytes but holds {written}"),
        ));
    }
    data.truncate(size);
    Ok(Loose::Object(SourceObject { kind, data }))
}

/// Inflates the zlib stream read from `input` (from its current position), handing the output
/// to `emit` in pieces of at most [`STREAM_CHUNK`] bytes; exactly `expected` bytes must come
/// out, and nothing past them is handed on. Holds one input and one output buffer, whatever
/// the size. Data errors carry the offset from the start of the stream.
fn inflate_stream<E>(
    inflate: &mut Inflate,
    input: &mut impl Read,
    expected: u64,
    mut emit: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), StreamFailure<E>> {
    inflate.reset(true);
    let mut compressed = vec![0u8; MAX_CHUNK];
    let mut out = vec![0u8; STREAM_CHUNK];
    let (mut start, mut end) = (0usize, 0usize);
    let mut total = 0u64;
    // At the end of the input the inflater is still called: it may hold output that did not
    // fit the last time.
    let mut eof = false;
    let data = |inflate: &Inflate, reason: String| StreamFailure::Data {
        at: inflate.total_in(),
        reason,
    };
    loop {
        if start == end && !eof {
            end = loop {
                match input.read(&mut compressed) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(StreamFailure::Io(e)),
                }
            };
            start = 0;
            eof = end == 0;
        }
        let (in_before, out_before) = (inflate.total_in(), inflate.total_out());
        let status = inflate.decompress(&compressed[start..end], &mut out, InflateFlush::NoFlush);
        let consumed = (inflate.total_in() - in_before) as usize;
        let produced = (inflate.total_out() - out_before) as usize;
        start += consumed;
        total += produced as u64;
        if total > expected {
            return Err(data(
                inflate,
                format!("the object announced {expected} bytes but holds more"),
            ));
        }
        if produced > 0 {
            emit(&out[..produced]).map_err(StreamFailure::Sink)?;
        }
        match status {
            Ok(Status::StreamEnd) => break,
            Ok(_) if consumed > 0 || produced > 0 => {}
            Ok(_) => {
                return Err(data(
                    inflate,
                    "the compressed stream is truncated".to_owned(),
                ));
            }
            Err(e) => return Err(data(inflate, e.as_str().to_owned())),
        }
    }
    if total != expected {
        return Err(data(
            inflate,
            format!("the object announced {expected} bytes but holds {total}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use git2::{Repository, Signature, Time};

    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let status = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    /// A history where files change a little per commit, so a repack makes delta chains.
    fn history(dir: &Path) -> Repository {
        let repo = Repository::init(dir).unwrap();
        let signature = Signature::new("t", "t@example.invalid", &Time::new(1, 0)).unwrap();
        let mut parent: Option<Oid> = None;
        let mut next = rng(0x0123_4567_89AB_CDEF);
        let random: Vec<u8> = (0..(2 * MAX_CHUNK + 12_345) / 8)
            .flat_map(|_| next().to_le_bytes())
            .collect();
        let huge = repo.blob(&random).unwrap();
        for version in 0..30u32 {
            let mut builder = repo.treebuilder(None).unwrap();
            for file in 0..6u32 {
                let mut text = String::new();
                for line in 0..400u32 {
                    let edit = if line % 37 == version % 37 {
                        version
                    } else {
                        0
                    };
                    text.push_str(&format!("file {file} line {line} edit {edit}\n"));
                }
                let blob = repo.blob(text.as_bytes()).unwrap();
                builder
                    .insert(format!("f{file}.txt"), blob, 0o100644)
                    .unwrap();
            }
            // A large, incompressible-ish blob and an empty one.
            let big: Vec<u8> = (0..300_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect();
            builder
                .insert("big.bin", repo.blob(&big).unwrap(), 0o100644)
                .unwrap();
            builder
                .insert("empty", repo.blob(b"").unwrap(), 0o100644)
                .unwrap();
            // Random bytes: their compressed stream spans several reads of the pack.
            builder.insert("huge.bin", huge, 0o100644).unwrap();
            let tree = repo.find_tree(builder.write().unwrap()).unwrap();
            let parents: Vec<git2::Commit<'_>> = parent
                .iter()
                .map(|id| repo.find_commit(*id).unwrap())
                .collect();
            let refs: Vec<&git2::Commit<'_>> = parents.iter().collect();
            parent = Some(
                repo.commit(
                    Some("HEAD"),
                    &signature,
                    &signature,
                    &format!("v{version}"),
                    &tree,
                    &refs,
                )
                .unwrap(),
            );
        }
        repo
    }

    fn all_ids(repo: &Repository) -> Vec<Oid> {
        let mut ids = Vec::new();
        repo.odb()
            .unwrap()
            .foreach(|id| {
                ids.push(*id);
                true
            })
            .unwrap();
        ids.sort();
        ids.dedup();
        ids
    }

    /// Every object read by this reader equals libgit2's (verified) read; returns how many
    /// the reader handled itself.
    fn assert_reads_match_libgit2(repo: &Repository) -> usize {
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let mut reader = store.reader();
        let odb = repo.odb().unwrap();
        let mut handled = 0;
        for id in all_ids(repo) {
            let expected = odb.read(id).unwrap();
            if let Some(object) = reader.read(id).unwrap() {
                assert_eq!(object.kind, expected.kind(), "{id}");
                assert_eq!(object.data, expected.data(), "{id}");
                handled += 1;
            }
        }
        handled
    }

    #[test]
    fn loose_objects_read_as_libgit2_reads_them() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = history(dir.path());
        let count = all_ids(&repo).len();
        assert_eq!(assert_reads_match_libgit2(&repo), count);
    }

    #[test]
    fn packed_objects_with_offset_and_reference_deltas_read_as_libgit2_reads_them() {
        for offsets in ["true", "false"] {
            let dir = tempfile::TempDir::new().unwrap();
            let repo = history(dir.path());
            let count = all_ids(&repo).len();
            git(
                dir.path(),
                &[
                    "-c",
                    &format!("repack.useDeltaBaseOffset={offsets}"),
                    "repack",
                    "-adq",
                    "--window=50",
                    "--depth=50",
                ],
            );
            git(dir.path(), &["prune-packed"]);
            let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
            assert_eq!(store.packs.len(), 1);
            // The pack really holds chains of deltas of the kind asked for.
            let mut reader = store.reader();
            let (mut by_offset, mut by_reference) = (0, 0);
            for id in all_ids(&repo) {
                let at = store.packs[0].find(id.as_bytes()).unwrap();
                match reader.entry_header(0, at).unwrap().unwrap() {
                    EntryHeader::Whole { .. } => {}
                    EntryHeader::OffsetDelta { .. } => by_offset += 1,
                    EntryHeader::RefDelta { .. } => by_reference += 1,
                }
            }
            if offsets == "true" {
                assert!(
                    by_offset > 50 && by_reference == 0,
                    "{by_offset} {by_reference}"
                );
            } else {
                assert!(
                    by_reference > 50 && by_offset == 0,
                    "{by_offset} {by_reference}"
                );
            }
            let verify = Command::new("git")
                .args(["verify-pack", "-v"])
                .arg(store.packs[0].pack_path.with_extension("idx"))
                .output()
                .unwrap();
            let listing = String::from_utf8_lossy(&verify.stdout);
            assert!(
                listing.contains("chain length = 2"),
                "no delta chains: {listing}"
            );
            let repo = Repository::open(dir.path()).unwrap();
            assert_eq!(
                assert_reads_match_libgit2(&repo),
                count,
                "useDeltaBaseOffset={offsets}"
            );
        }
    }

    #[test]
    fn objects_outside_the_store_are_left_to_libgit2() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let missing = Oid::hash_object(ObjectType::Blob, b"never written").unwrap();
        assert_eq!(store.reader().read(missing).unwrap(), None);
    }

    #[test]
    fn a_damaged_pack_or_loose_object_is_an_error_that_names_the_file() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = history(dir.path());
        let head = repo.head().unwrap().peel_to_tree().unwrap();
        let big = head.get_name("big.bin").unwrap().id();
        // Loose: truncate the object file.
        let hex = big.to_string();
        let loose = repo.path().join("objects").join(&hex[..2]).join(&hex[2..]);
        let bytes = fs::read(&loose).unwrap();
        let mut permissions = fs::metadata(&loose).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        permissions.set_readonly(false);
        fs::set_permissions(&loose, permissions).unwrap();
        fs::write(&loose, &bytes[..bytes.len() / 2]).unwrap();
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let error = store.reader().read(big).unwrap_err();
        assert!(
            matches!(&error, SourceReadError::Corrupt { path, .. } if *path == loose),
            "{error}"
        );
        assert!(error.to_string().contains("git fsck"), "{error}");
        // A well-formed object under another object's name.
        fs::write(&loose, crate::loose::encode_loose_blob(b"other content")).unwrap();
        let error = store.reader().read(big).unwrap_err();
        assert!(
            error.to_string().contains("does not hash to its ID"),
            "{error}"
        );
        fs::write(&loose, &bytes).unwrap();
        assert!(store.reader().read(big).unwrap().is_some());

        // Packed: damage the middle of the big blob's compressed data.
        git(dir.path(), &["repack", "-adq"]);
        git(dir.path(), &["prune-packed"]);
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let offset = store.packs[0].find(big.as_bytes()).unwrap();
        let pack_path = store.packs[0].pack_path.clone();
        let mut pack = fs::read(&pack_path).unwrap();
        for byte in &mut pack[offset as usize + 100..offset as usize + 140] {
            *byte ^= 0x55;
        }
        let mut permissions = fs::metadata(&pack_path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        permissions.set_readonly(false);
        fs::set_permissions(&pack_path, permissions).unwrap();
        fs::write(&pack_path, &pack).unwrap();
        let error = store.reader().read(big).unwrap_err();
        assert!(
            matches!(&error, SourceReadError::Corrupt { path, .. } if *path == pack_path),
            "{error}"
        );
    }

    /// Small enough that `big.bin` (300 000 bytes) and `huge.bin` (2 MiB) of [`history`] stream.
    const SMALL: ReadLimits = ReadLimits {
        stream_above: 64 << 10,
        max_deltified: MAX_DELTIFIED,
    };

    /// Small enough that the deltified text files of [`history`] (about 10 KB) stream too.
    const TINY: ReadLimits = ReadLimits {
        stream_above: 4096,
        max_deltified: MAX_DELTIFIED,
    };

    #[test]
    fn deltified_objects_above_the_limit_stream_from_their_base_as_libgit2_reads_them() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = history(dir.path());
        git(dir.path(), &["repack", "-adq", "--window=50", "--depth=50"]);
        git(dir.path(), &["prune-packed"]);
        let repo = Repository::open(repo.path()).unwrap();
        let odb = repo.odb().unwrap();
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let mut reader = store.reader_with(TINY);
        let mut writer = store.reader_with(TINY);
        let mut deltas = 0;
        for id in all_ids(&repo) {
            let expected = odb.read(id).unwrap();
            match reader.read_bounded(id).unwrap().unwrap() {
                Found::Loaded(object) => {
                    assert!(object.data.len() as u64 <= TINY.stream_above);
                    assert_eq!(object.data, expected.data(), "{id}");
                }
                Found::Large(large) => {
                    deltas += usize::from(matches!(large.at, LargeAt::Delta { .. }));
                    assert_eq!(
                        (large.kind, large.size),
                        (expected.kind(), expected.len() as u64)
                    );
                    let (data, pieces) = stream_all(&mut writer, id, &large).unwrap();
                    assert!(data == expected.data(), "{id}");
                    assert!(pieces.iter().all(|n| *n <= STREAM_CHUNK), "{pieces:?}");
                }
            }
        }
        assert!(deltas > 50, "{deltas} deltas streamed");
        // A delta streamed against a base over the bound is refused, as when held.
        let tight = ReadLimits {
            stream_above: 4096,
            max_deltified: 4096,
        };
        let refused = all_ids(&repo).into_iter().find_map(|id| {
            let mut reader = store.reader_with(tight);
            match reader.read_bounded(id).unwrap()? {
                Found::Large(large) if matches!(large.at, LargeAt::Delta { .. }) => {
                    Some(stream_all(&mut reader, id, &large).unwrap_err())
                }
                _ => None,
            }
        });
        assert!(
            matches!(
                refused,
                Some(SourceReadError::DeltaTooLarge { limit: 4096, .. })
            ),
            "{refused:?}"
        );
    }

    /// Streams `large` with `reader`: the content and the size of each piece.
    fn stream_all(
        reader: &mut SourceReader<'_>,
        id: Oid,
        large: &LargeObject,
    ) -> Result<(Vec<u8>, Vec<usize>), SourceReadError> {
        let (mut data, mut pieces) = (Vec::new(), Vec::new());
        reader.stream(id, large, |piece| {
            pieces.push(piece.len());
            data.extend_from_slice(piece);
            Ok::<_, SourceReadError>(())
        })?;
        Ok((data, pieces))
    }

    #[test]
    fn whole_objects_above_the_limit_stream_in_pieces_loose_and_packed_as_libgit2_reads_them() {
        for packed in [false, true] {
            let dir = tempfile::TempDir::new().unwrap();
            let repo = history(dir.path());
            if packed {
                git(dir.path(), &["repack", "-adq", "--window=50", "--depth=50"]);
                git(dir.path(), &["prune-packed"]);
            }
            let repo = Repository::open(repo.path()).unwrap();
            let odb = repo.odb().unwrap();
            let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
            assert_eq!(store.packs.len(), usize::from(packed));
            let mut reader = store.reader_with(SMALL);
            // Another reader of the same store streams what this one found (the export's
            // writer thread streams what a worker found).
            let mut writer = store.reader_with(SMALL);
            let mut large = 0;
            for id in all_ids(&repo) {
                let expected = odb.read(id).unwrap();
                match reader.read_bounded(id).unwrap().unwrap() {
                    Found::Loaded(object) => {
                        assert_eq!(object.data, expected.data(), "{id}");
                    }
                    Found::Large(object) => {
                        large += 1;
                        assert_eq!(object.kind, expected.kind());
                        assert_eq!(object.size, expected.len() as u64);
                        assert!(object.size > SMALL.stream_above);
                        let (data, pieces) = stream_all(&mut writer, id, &object).unwrap();
                        assert!(data == expected.data(), "{id} packed={packed}");
                        assert!(pieces.iter().all(|n| *n <= STREAM_CHUNK), "{pieces:?}");
                        if object.size > 2 * STREAM_CHUNK as u64 {
                            assert!(pieces.len() > 2, "{pieces:?}");
                        }
                        // A sink's error stops the stream and is what the caller gets.
                        let mut calls = 0;
                        let stopped = reader.stream(id, &object, |_| {
                            calls += 1;
                            Err(SourceReadError::Io {
                                path: PathBuf::from("sink"),
                                source: io::Error::other("full"),
                            })
                        });
                        assert!(
                            matches!(&stopped, Err(SourceReadError::Io { path, .. }) if path == Path::new("sink"))
                        );
                        assert_eq!(calls, 1);
                    }
                }
                // `read` gives the whole object either way.
                assert_eq!(reader.read(id).unwrap().unwrap().data, expected.data());
            }
            // big.bin and huge.bin (the random one spans several reads of compressed input).
            assert_eq!(large, 2, "packed={packed}");
            assert_eq!(assert_reads_match_libgit2(&repo), all_ids(&repo).len());
        }
    }

    #[test]
    fn a_damaged_large_object_is_an_error_naming_its_file_even_after_pieces_went_out() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = history(dir.path());
        let head = repo.head().unwrap().peel_to_tree().unwrap();
        let big = head.get_name("big.bin").unwrap().id();
        let hex = big.to_string();
        let loose = repo.path().join("objects").join(&hex[..2]).join(&hex[2..]);
        let bytes = fs::read(&loose).unwrap();
        let mut permissions = fs::metadata(&loose).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        permissions.set_readonly(false);
        fs::set_permissions(&loose, permissions).unwrap();
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let large = |reader: &mut SourceReader<'_>| match reader.read_bounded(big).unwrap() {
            Some(Found::Large(large)) => large,
            other => panic!("not streamed: {other:?}"),
        };

        // A well-formed object of the same size under another object's name: every piece
        // goes out, then the ID check fails.
        let other: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        fs::write(&loose, crate::loose::encode_loose_blob(&other)).unwrap();
        let mut reader = store.reader_with(SMALL);
        let object = large(&mut reader);
        let mut received = 0;
        let error = reader
            .stream(big, &object, |piece| {
                received += piece.len();
                Ok::<_, SourceReadError>(())
            })
            .unwrap_err();
        assert_eq!(received, other.len());
        assert!(
            matches!(&error, SourceReadError::Corrupt { path, reason, .. }
                if *path == loose && reason.contains("does not hash to its ID")),
            "{error}"
        );
        assert!(error.to_string().contains("git fsck"), "{error}");

        // Truncated: the header is found, the stream ends early.
        fs::write(&loose, &bytes[..bytes.len() / 2]).unwrap();
        let object = large(&mut reader);
        let error = stream_all(&mut reader, big, &object).unwrap_err();
        assert!(
            matches!(&error, SourceReadError::Corrupt { path, reason, .. }
                if *path == loose && reason.contains("truncated")),
            "{error}"
        );
        fs::write(&loose, &bytes).unwrap();
        let object = large(&mut reader);
        assert!(stream_all(&mut reader, big, &object).unwrap().0.len() == 300_000);

        // Packed: damage the middle of the big blob's compressed data.
        git(dir.path(), &["repack", "-adq"]);
        git(dir.path(), &["prune-packed"]);
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let offset = store.packs[0].find(big.as_bytes()).unwrap();
        let pack_path = store.packs[0].pack_path.clone();
        let mut pack = fs::read(&pack_path).unwrap();
        for byte in &mut pack[offset as usize + 1000..offset as usize + 1040] {
            *byte ^= 0x55;
        }
        let mut permissions = fs::metadata(&pack_path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        permissions.set_readonly(false);
        fs::set_permissions(&pack_path, permissions).unwrap();
        fs::write(&pack_path, &pack).unwrap();
        let mut reader = store.reader_with(SMALL);
        let object = large(&mut reader);
        let error = stream_all(&mut reader, big, &object).unwrap_err();
        assert!(
            matches!(&error, SourceReadError::Corrupt { path, .. } if *path == pack_path),
            "{error}"
        );
    }

    #[test]
    fn a_deltified_object_over_the_bound_is_refused_with_advice_to_repack() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = history(dir.path());
        git(dir.path(), &["repack", "-adq", "--window=50", "--depth=50"]);
        git(dir.path(), &["prune-packed"]);
        let repo = Repository::open(repo.path()).unwrap();
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let mut probe = store.reader();
        let deltified = all_ids(&repo)
            .into_iter()
            .find(|id| {
                let at = store.packs[0].find(id.as_bytes()).unwrap();
                matches!(
                    probe.entry_header(0, at).unwrap().unwrap(),
                    EntryHeader::OffsetDelta { .. }
                ) && repo.find_blob(*id).is_ok_and(|b| b.size() > 4096)
            })
            .unwrap();
        let tight = ReadLimits {
            stream_above: STREAM_ABOVE,
            max_deltified: 4096,
        };
        let error = store.reader_with(tight).read(deltified).unwrap_err();
        assert!(
            matches!(&error, SourceReadError::DeltaTooLarge { path, limit: 4096, .. }
                if *path == store.packs[0].pack_path),
            "{error}"
        );
        assert!(error.to_string().contains("git repack -a -d -f"), "{error}");
        let odb = repo.odb().unwrap();
        let expected = odb.read(deltified).unwrap();
        assert_eq!(
            store.reader().read(deltified).unwrap().unwrap().data,
            expected.data()
        );
    }

    /// A pack entry's type-and-size header.
    fn entry_head(kind: u8, mut size: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut byte = (kind << 4) | (size & 0x0f) as u8;
        size >>= 4;
        while size != 0 {
            bytes.push(byte | 0x80);
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        bytes.push(byte);
        bytes
    }

    /// A delta's size varint.
    fn delta_size(mut size: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        loop {
            let byte = (size & 0x7f) as u8;
            size >>= 7;
            if size == 0 {
                bytes.push(byte);
                return bytes;
            }
            bytes.push(byte | 0x80);
        }
    }

    /// A store of one hand-written pack: blob `base` whole, then `delta` as an offset delta
    /// of it, named `id` in a hand-written index (CRCs and index checksums, which the reader
    /// does not check, zeroed). Returns the store's directory and the pack's path.
    fn delta_store(base: &[u8], delta: &[u8], id: Oid) -> (tempfile::TempDir, PathBuf) {
        use crate::pack::{ObjectKind, encode_entry};
        let base_id = Oid::hash_object(ObjectType::Blob, base).unwrap();
        let mut pack = b"PACK\0\0\0\x02\0\0\0\x02".to_vec();
        let base_at = pack.len() as u64;
        pack.extend_from_slice(&encode_entry(base_id, ObjectKind::Blob, base).bytes);
        let delta_at = pack.len() as u64;
        pack.extend(entry_head(6, delta.len()));
        let mut distance = delta_at - base_at;
        let mut offset = vec![(distance & 0x7f) as u8];
        distance >>= 7;
        while distance != 0 {
            distance -= 1;
            offset.push(0x80 | (distance & 0x7f) as u8);
            distance >>= 7;
        }
        offset.reverse();
        pack.extend(offset);
        let zlib = encode_entry(id, ObjectKind::Blob, delta).bytes;
        pack.extend_from_slice(&zlib[entry_head(3, delta.len()).len()..]);
        let trailer = Sha1::digest(&pack);
        pack.extend_from_slice(&trailer);
        let mut names = [(base_id, base_at), (id, delta_at)];
        names.sort();
        let mut idx = IDX_MAGIC.to_vec();
        idx.extend(2u32.to_be_bytes());
        for slot in 0..256 {
            let count = names
                .iter()
                .filter(|(name, _)| usize::from(name.as_bytes()[0]) <= slot)
                .count() as u32;
            idx.extend(count.to_be_bytes());
        }
        for (name, _) in &names {
            idx.extend_from_slice(name.as_bytes());
        }
        idx.extend([0u8; 8]);
        for (_, at) in &names {
            idx.extend((*at as u32).to_be_bytes());
        }
        idx.extend([0u8; 40]);
        let dir = tempfile::TempDir::new().unwrap();
        let pack_dir = dir.path().join("pack");
        fs::create_dir(&pack_dir).unwrap();
        let pack_path = pack_dir.join("pack-test.pack");
        fs::write(&pack_path, &pack).unwrap();
        fs::write(pack_dir.join("pack-test.idx"), &idx).unwrap();
        (dir, pack_path)
    }

    /// Object `id` of the store under `dir`, streamed when it is large.
    fn read_streaming(dir: &Path, limits: ReadLimits, id: Oid) -> Result<Found, SourceReadError> {
        let store = SourceObjects::open(dir)?;
        let mut reader = store.reader_with(limits);
        let found = reader
            .read_bounded(id)?
            .ok_or_else(|| SourceReadError::Corrupt {
                path: dir.to_owned(),
                offset: 0,
                reason: "not handled".to_owned(),
            })?;
        if let Found::Large(large) = &found {
            let (data, pieces) = stream_all(&mut store.reader_with(limits), id, large)?;
            assert!(pieces.iter().all(|n| *n <= STREAM_CHUNK), "{pieces:?}");
            assert!(pieces.iter().rev().skip(1).all(|n| *n == STREAM_CHUNK));
            return Ok(Found::Loaded(SourceObject {
                kind: large.kind,
                data,
            }));
        }
        Ok(found)
    }

    /// Copies `len` bytes of the base from `offset` (a Git delta copy instruction).
    fn copy(offset: u32, len: u32) -> Vec<u8> {
        let mut command = 0x80u8;
        let mut bytes = Vec::new();
        for bit in 0..4 {
            let byte = (offset >> (8 * bit)) as u8;
            if byte != 0 {
                command |= 1 << bit;
                bytes.push(byte);
            }
        }
        for bit in 0..3 {
            let byte = (len >> (8 * bit)) as u8;
            if byte != 0 {
                command |= 0x10 << bit;
                bytes.push(byte);
            }
        }
        bytes.insert(0, command);
        bytes
    }

    /// A delta of `base_len` bytes announcing `target`, then `instructions`.
    fn delta_of(base_len: usize, target: usize, instructions: &[Vec<u8>]) -> Vec<u8> {
        let mut delta = delta_size(base_len);
        delta.extend(delta_size(target));
        for instruction in instructions {
            delta.extend_from_slice(instruction);
        }
        delta
    }

    #[test]
    fn a_delta_larger_than_its_bound_streams_from_a_small_base_and_damage_is_refused() {
        let base = rng_bytes(4096);
        let limits = ReadLimits {
            stream_above: 8192,
            max_deltified: 16384,
        };
        // 300 copies of the base (1.2 MiB, over both limits), then an insert: only the
        // 4 KiB base and the 1 KiB delta are held.
        let mut instructions: Vec<Vec<u8>> = (0..300).map(|_| copy(0, 4096)).collect();
        instructions.push(copy(100, 50));
        instructions.push(b"\x05tail!".to_vec());
        let mut expected = base.repeat(300);
        expected.extend_from_slice(&base[100..150]);
        expected.extend_from_slice(b"tail!");
        let delta = delta_of(base.len(), expected.len(), &instructions);
        let id = Oid::hash_object(ObjectType::Blob, &expected).unwrap();
        let (dir, pack_path) = delta_store(&base, &delta, id);
        let store = SourceObjects::open(dir.path()).unwrap();
        match store.reader_with(limits).read_bounded(id).unwrap().unwrap() {
            Found::Large(large) => {
                assert!(matches!(large.at, LargeAt::Delta { .. }), "{large:?}");
                assert_eq!(
                    (large.kind, large.size),
                    (ObjectType::Blob, expected.len() as u64)
                );
            }
            found => panic!("not streamed: {found:?}"),
        }
        let read = read_streaming(dir.path(), limits, id).unwrap();
        assert!(
            matches!(&read, Found::Loaded(o) if o.kind == ObjectType::Blob && o.data == expected)
        );
        assert!(store.reader_with(limits).read(id).unwrap().unwrap().data == expected);
        // Git agrees the pack holds that object.
        let check = tempfile::TempDir::new().unwrap();
        let repo = Repository::init_bare(check.path()).unwrap();
        let copied = check.path().join("objects/pack/pack-test.pack");
        fs::copy(&pack_path, &copied).unwrap();
        git(check.path(), &["index-pack", copied.to_str().unwrap()]);
        assert!(repo.odb().unwrap().read(id).unwrap().data() == expected);

        // Each damage is a typed error, never a panic or other content.
        let corrupt = |delta: &[u8], id: Oid, limits: ReadLimits| {
            let (dir, _) = delta_store(&base, delta, id);
            read_streaming(dir.path(), limits, id).unwrap_err()
        };
        let reasons = [
            (
                delta_of(
                    4096,
                    8192 + 4096,
                    &[copy(0, 4096), copy(0, 4096), copy(4000, 4096)],
                ),
                "a delta copy reads past its base",
            ),
            (
                delta_of(4097, 300 * 4096, &[copy(0, 4096)]),
                "the delta's source size is not its base's size",
            ),
            (
                delta_of(4096, 3 * 4096, &[copy(0, 4096), copy(0, 4096)]),
                "the delta writes less than its target size",
            ),
            (
                delta_of(4096, 3 * 4096, &vec![copy(0, 4096); 4]),
                "the delta writes more than its target size",
            ),
            (
                delta_of(4096, 3 * 4096, &[copy(0, 4096), vec![0]]),
                "the delta uses the reserved instruction 0",
            ),
            (
                delta_of(4096, 3 * 4096, &[copy(0, 4096), b"\x7fshort".to_vec()]),
                "a delta insert runs past the delta",
            ),
        ];
        for (delta, reason) in &reasons {
            let error = corrupt(delta, id, limits);
            assert!(
                matches!(&error, SourceReadError::Corrupt { reason: r, .. } if r == reason),
                "{reason}: {error}"
            );
        }
        // Content that does not hash to the ID it is stored under.
        let other = Oid::hash_object(ObjectType::Blob, b"another").unwrap();
        let error = corrupt(&delta, other, limits);
        assert!(
            matches!(&error, SourceReadError::Corrupt { reason, .. }
                if reason == "the object's content does not hash to its ID"),
            "{error}"
        );
        // A base, or a delta, over the bound is refused before it is read.
        let tight = ReadLimits {
            stream_above: 1024,
            max_deltified: 2048,
        };
        let error = corrupt(&delta, id, tight);
        assert!(
            matches!(
                &error,
                SourceReadError::DeltaTooLarge {
                    size: 4096,
                    limit: 2048,
                    ..
                }
            ),
            "{error}"
        );
        // 200 inserts of 127 bytes: a 25,600-byte delta, over the 16 KiB bound.
        let inserts: Vec<Vec<u8>> = (0..200)
            .map(|n| {
                let mut insert = vec![127u8];
                insert.extend_from_slice(&base[n..n + 127]);
                insert
            })
            .collect();
        let long = delta_of(4096, 200 * 127, &inserts);
        let error = corrupt(&long, id, limits);
        assert!(
            matches!(&error, SourceReadError::DeltaTooLarge { size, limit: 16384, .. }
                if *size == long.len() as u64),
            "{error}"
        );

        // Random damage to the pack: an error or the right content, never a panic.
        let mut next = rng(0xDE17_A5EE_D000_0016);
        let pristine = fs::read(&pack_path).unwrap();
        for _ in 0..300 {
            let mut damaged = pristine.clone();
            for _ in 0..1 + next() % 3 {
                let at = 12 + (next() as usize) % (damaged.len() - 32);
                damaged[at] ^= 1 << (next() % 8);
            }
            fs::write(&pack_path, &damaged).unwrap();
            if let Ok(Found::Loaded(object)) = read_streaming(dir.path(), limits, id) {
                assert!(object.data == expected);
            }
        }
    }

    fn rng_bytes(len: usize) -> Vec<u8> {
        let mut next = rng(0x0BA5_E000_0000_4096);
        (0..len).map(|_| next() as u8).collect()
    }

    #[test]
    fn deltas_apply_copies_and_inserts_and_reject_what_git_never_writes() {
        let base = b"0123456789";
        // source 10, target 7: copy offset 2 len 3 ("234"), insert "abcd".
        let delta = [10, 7, 0x80 | 0x01 | 0x10, 2, 3, 4, b'a', b'b', b'c', b'd'];
        assert_eq!(apply_delta(base, &delta).unwrap(), b"234abcd");
        // Copy with size 0 means 0x10000.
        let large = vec![7u8; 0x1_0000];
        let delta = [0x80, 0x80, 0x04, 0x80, 0x80, 0x04, 0x80];
        assert_eq!(apply_delta(&large, &delta).unwrap(), large);
        for (delta, reason) in [
            (vec![9, 1, 1, b'x'], "source size"),
            (vec![10, 3, 0x80 | 0x01 | 0x10, 8, 3], "past its base"),
            (vec![10, 3, 5, b'x'], "past the delta"),
            (vec![10, 1, 0], "reserved"),
            (vec![10, 1, 2, b'x', b'y'], "more than"),
            (vec![10, 3, 1, b'x'], "less than"),
            (vec![10], "truncated"),
        ] {
            let error = apply_delta(base, &delta).unwrap_err();
            assert!(error.contains(reason), "{delta:?}: {error}");
        }
    }

    #[test]
    fn an_announced_size_the_data_cannot_hold_is_refused_before_allocating() {
        assert!(can_hold(10, 10_000));
        assert!(!can_hold(10, usize::MAX / 2));
        // A loose blob that claims an exabyte.
        let mut forged = Vec::new();
        let header = b"blob 1000000000000000000\0x";
        crate::loose::write_stored_zlib(&mut forged, &[header]).unwrap();
        let mut inflate = Inflate::new(true, 15);
        let (_, reason) =
            decode_loose(&mut inflate, &forged, forged.len() as u64, u64::MAX).unwrap_err();
        assert!(reason.contains("more than its file can hold"), "{reason}");
    }

    #[test]
    fn entry_headers_parse_sizes_and_bases() {
        // Blob of 300 bytes: 0b1011_1100 (type 3, low bits 12, more), then 300 >> 4 = 18.
        match parse_entry_header(&[0xbc, 0x12], 1000).unwrap() {
            EntryHeader::Whole {
                kind,
                size,
                data_at,
            } => {
                assert_eq!((kind, size, data_at), (ObjectType::Blob, 300, 1002));
            }
            _ => panic!("not a whole object"),
        }
        // Offset delta of 5 bytes, base distance 0x80 → encoded [0x80, 0x00] (128 = (0+1)·128 + 0).
        match parse_entry_header(&[0x65, 0x80, 0x00], 1000).unwrap() {
            EntryHeader::OffsetDelta {
                size,
                data_at,
                base_at,
            } => {
                assert_eq!((size, data_at, base_at), (5, 1003, 872));
            }
            _ => panic!("not an offset delta"),
        }
        assert!(
            parse_entry_header(&[0x65, 0x7f], 100).is_err(),
            "base before the pack"
        );
        assert!(
            parse_entry_header(&[0x55, 0x00], 100).is_err(),
            "type 5 is reserved"
        );
        assert!(
            parse_entry_header(&[0x7f], 100).is_err(),
            "truncated reference"
        );
        assert!(
            parse_entry_header(&[0xbf, 0xff, 0xff], 100).is_err(),
            "truncated size"
        );
    }

    /// xorshift64: a fixed, dependency-free stream of test inputs.
    fn rng(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn damaged_input_never_panics_and_a_damaged_object_never_reads_as_another() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = history(dir.path());
        git(dir.path(), &["repack", "-adq", "--window=50", "--depth=50"]);
        git(dir.path(), &["prune-packed"]);
        let repo = Repository::open(repo.path()).unwrap();
        let odb = repo.odb().unwrap();
        let ids = all_ids(&repo);
        let originals: HashMap<Oid, Vec<u8>> = ids
            .iter()
            .map(|id| (*id, odb.read(*id).unwrap().data().to_vec()))
            .collect();
        let store = SourceObjects::open(&repo.path().join("objects")).unwrap();
        let pack_path = store.packs[0].pack_path.clone();
        let pristine = fs::read(&pack_path).unwrap();
        let mut permissions = fs::metadata(&pack_path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        permissions.set_readonly(false);
        fs::set_permissions(&pack_path, permissions).unwrap();
        let mut next = rng(0x5EED_0BAD_F00D_CAFE);
        let (mut failed, mut read) = (0, 0);
        for round in 0..60 {
            let mut damaged = pristine.clone();
            for _ in 0..1 + next() % 3 {
                let at = 12 + (next() as usize) % (damaged.len() - 32);
                damaged[at] ^= 1 << (next() % 8);
            }
            fs::write(&pack_path, &damaged).unwrap();
            // Every other round, most objects stream (whole ones inflated, deltas applied).
            let mut reader = if round % 2 == 0 {
                store.reader()
            } else {
                store.reader_with(TINY)
            };
            for id in &ids {
                match reader.read(*id) {
                    Ok(Some(object)) => {
                        read += 1;
                        // zlib's Adler-32 and the delta size checks catch what a flip changes.
                        assert_eq!(&object.data, &originals[id], "{id} read as another object");
                    }
                    Ok(None) => {}
                    Err(SourceReadError::Corrupt { .. }) => failed += 1,
                    Err(other) => panic!("{other}"),
                }
            }
        }
        assert!(failed > 0 && read > 0, "{failed} {read}");

        // The parsers on their own, on truncated and bit-flipped input.
        let delta = [10u8, 7, 0x80 | 0x01 | 0x10, 2, 3, 4, b'a', b'b', b'c', b'd'];
        let header = [0xbcu8, 0x12, 0x65, 0x80, 0x00];
        let loose = crate::loose::encode_loose_blob(b"some content\n");
        let mut inflate = Inflate::new(true, 15);
        for _ in 0..20_000 {
            let mut bytes = match next() % 3 {
                0 => delta.to_vec(),
                1 => header.to_vec(),
                _ => loose.clone(),
            };
            let cut = (next() as usize) % (bytes.len() + 1);
            bytes.truncate(cut.max(1));
            let at = (next() as usize) % bytes.len();
            bytes[at] ^= next() as u8;
            let _ = apply_delta(b"0123456789", &bytes);
            let _ = parse_entry_header(&bytes, next() % 4096);
            let _ = decode_loose(&mut inflate, &bytes, bytes.len() as u64, u64::MAX);
        }
    }
}
