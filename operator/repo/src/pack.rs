//! Writing one Git packfile (version 2) and its index (version 2) of whole (undeltified)
//! objects, each a zlib stream of *stored* deflate blocks ([`crate::loose`]).
//!
//! A projection is ephemeral and written once, so one pack of stored objects is the cheapest
//! object database Git reads: a single sequential file instead of a zlib-compressed file per
//! object. Entries are encoded anywhere ([`encode_entry`] is pure and thread-safe) and
//! appended by one [`PackWriter`] in any order; [`PackWriter::finish`] writes the trailer and
//! the index and only then gives the pack its final name (`pack-<checksum>.pack` first, then
//! `.idx`, as Git does), so a pack is never visible half-written.
//!
//! An object too large to hold in memory is written in pieces instead ([`PackWriter::begin`]
//! → [`EntryWriter`]): its stored blocks, CRC-32 and the pack's SHA-1 are produced as the
//! pieces come, so the writer holds no copy of it.
//!
//! The caller vouches that each entry's ID is the object's ID (the projector takes blob IDs
//! from the source tree and hashes the trees and commit it builds); `git fsck` verifies it.

use std::{
    collections::HashSet,
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

use git2::Oid;
use sha1::{Digest, Sha1};

use crate::loose::StoredZlib;

/// Pack object types used by the projector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A commit.
    Commit = 1,
    /// A tree.
    Tree = 2,
    /// A blob.
    Blob = 3,
}

/// One encoded pack entry: object header, stored zlib stream, and the CRC-32 of both (what
/// the index records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackEntry {
    /// Object ID.
    pub id: Oid,
    /// Entry bytes, as they go into the pack.
    pub bytes: Vec<u8>,
    /// CRC-32 of `bytes`.
    pub crc: u32,
}

/// The type-and-size header of a whole object's entry (at most 10 bytes for a 64-bit size).
fn entry_header(kind: ObjectKind, size: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(10);
    let mut size = size;
    let mut byte = ((kind as u8) << 4) | (size & 0x0f) as u8;
    size >>= 4;
    while size != 0 {
        bytes.push(byte | 0x80);
        byte = (size & 0x7f) as u8;
        size >>= 7;
    }
    bytes.push(byte);
    bytes
}

/// Encodes a whole object as a pack entry (type-and-size header, then the stored zlib stream
/// of `content`).
pub fn encode_entry(id: Oid, kind: ObjectKind, content: &[u8]) -> PackEntry {
    let blocks = content.len().div_ceil(65_535).max(1);
    let mut bytes = entry_header(kind, content.len() as u64);
    bytes.reserve(content.len() + 5 * blocks + 6);
    // Writing into a Vec cannot fail, and the content is exactly what is announced.
    let _ = StoredZlib::begin(&mut bytes, content.len() as u64).and_then(|mut zlib| {
        zlib.write(&mut bytes, content)?;
        zlib.finish(&mut bytes)
    });
    let crc = crc32(0, &bytes);
    PackEntry { id, bytes, crc }
}

/// CRC-32 (IEEE, as zlib's `crc32`), continuing from `crc` (carry-less multiplication
/// where the CPU has it).
pub fn crc32(crc: u32, data: &[u8]) -> u32 {
    zlib_rs::crc32::crc32(crc, data)
}

/// Appends entries to a new pack under `objects/pack/` and writes its index.
pub struct PackWriter {
    dir: PathBuf,
    tmp_pack: PathBuf,
    out: io::BufWriter<fs::File>,
    hasher: Sha1,
    offset: u64,
    expected: u32,
    seen: HashSet<Oid>,
    /// (ID, offset, CRC) of every appended entry.
    index: Vec<(Oid, u64, u32)>,
    /// An [`EntryWriter`] is open or was dropped or failed before it finished: the pack may
    /// hold part of an entry, and every later call fails.
    broken: bool,
}

/// Writes one entry of known size in pieces; see [`PackWriter::begin`].
pub struct EntryWriter<'pack> {
    pack: &'pack mut PackWriter,
    id: Oid,
    offset: u64,
    crc: u32,
    zlib: StoredZlib,
}

/// What an [`EntryWriter`] writes: into the pack (its SHA-1 and offset) and into the entry's
/// CRC-32.
struct EntryBytes<'a> {
    pack: &'a mut PackWriter,
    crc: &'a mut u32,
}

impl Write for EntryBytes<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.pack.write(bytes)?;
        *self.crc = crc32(*self.crc, bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// === impl EntryWriter ===

impl EntryWriter<'_> {
    /// Writes the next piece of the object's content.
    pub fn write(&mut self, content: &[u8]) -> io::Result<()> {
        self.zlib.write(
            &mut EntryBytes {
                pack: &mut *self.pack,
                crc: &mut self.crc,
            },
            content,
        )
    }

    /// Ends the entry and records it in the index. Fails if the content written is not the
    /// size announced to [`PackWriter::begin`].
    pub fn finish(self) -> io::Result<()> {
        let Self {
            pack,
            id,
            offset,
            mut crc,
            zlib,
        } = self;
        zlib.finish(&mut EntryBytes {
            pack: &mut *pack,
            crc: &mut crc,
        })?;
        pack.seen.insert(id);
        pack.index.push((id, offset, crc));
        // Whole again: the next entry may start.
        pack.broken = false;
        Ok(())
    }
}

fn broken() -> io::Error {
    io::Error::other("a pack entry was left unfinished; the pack cannot be completed")
}

impl PackWriter {
    /// Starts a pack of exactly `count` distinct objects in `pack_dir` (created if missing).
    pub fn create(pack_dir: &Path, count: u32) -> io::Result<Self> {
        fs::create_dir_all(pack_dir)?;
        let tmp_pack = pack_dir.join("tmp_pack_projection");
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp_pack)?;
        let mut writer = Self {
            dir: pack_dir.to_owned(),
            tmp_pack,
            out: io::BufWriter::with_capacity(1 << 20, file),
            hasher: Sha1::new(),
            offset: 0,
            expected: count,
            seen: HashSet::with_capacity(count as usize),
            index: Vec::with_capacity(count as usize),
            broken: false,
        };
        let mut header = Vec::with_capacity(12);
        header.extend_from_slice(b"PACK");
        header.extend_from_slice(&2u32.to_be_bytes());
        header.extend_from_slice(&count.to_be_bytes());
        writer.write(&header)?;
        Ok(writer)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.hasher.update(bytes);
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// Appends an entry; an object already in the pack is skipped (returns `false`).
    pub fn append(&mut self, entry: &PackEntry) -> io::Result<bool> {
        if !self.admit(entry.id)? {
            return Ok(false);
        }
        self.seen.insert(entry.id);
        self.index.push((entry.id, self.offset, entry.crc));
        self.write(&entry.bytes)?;
        Ok(true)
    }

    /// Starts the entry of a whole object of `size` bytes whose content is then written in
    /// pieces ([`EntryWriter::write`], [`EntryWriter::finish`]): nothing of it is held here.
    /// `None`: the object is already in the pack. Until the entry finishes, and for good if it
    /// is dropped or fails before, every other call fails: the pack holds part of an entry.
    pub fn begin(
        &mut self,
        id: Oid,
        kind: ObjectKind,
        size: u64,
    ) -> io::Result<Option<EntryWriter<'_>>> {
        if !self.admit(id)? {
            return Ok(None);
        }
        // Broken until the entry finishes.
        self.broken = true;
        let offset = self.offset;
        let header = entry_header(kind, size);
        self.write(&header)?;
        let mut crc = crc32(0, &header);
        let zlib = StoredZlib::begin(
            &mut EntryBytes {
                pack: self,
                crc: &mut crc,
            },
            size,
        )?;
        Ok(Some(EntryWriter {
            pack: self,
            id,
            offset,
            crc,
            zlib,
        }))
    }

    /// Whether an entry of `id` may go in next: `false` if it is already in; an error if the
    /// pack is broken or full.
    fn admit(&self, id: Oid) -> io::Result<bool> {
        if self.broken {
            return Err(broken());
        }
        if self.seen.contains(&id) {
            return Ok(false);
        }
        if self.index.len() >= self.expected as usize {
            return Err(io::Error::other(format!(
                "pack holds more objects than the {} announced",
                self.expected
            )));
        }
        Ok(true)
    }

    /// Whether `id` is already in the pack.
    pub fn contains(&self, id: Oid) -> bool {
        self.seen.contains(&id)
    }

    /// Writes the trailer and the index, names both after the pack checksum, and returns the
    /// path of the `.pack`. Fails if fewer objects than announced were appended.
    pub fn finish(mut self) -> io::Result<PathBuf> {
        if self.broken {
            return Err(broken());
        }
        if self.index.len() != self.expected as usize {
            return Err(io::Error::other(format!(
                "pack announced {} objects but holds {}",
                self.expected,
                self.index.len()
            )));
        }
        let checksum: [u8; 20] = self.hasher.finalize_reset().into();
        self.out.write_all(&checksum)?;
        // Projections are ephemeral: like their working-tree files, the pack is not fsynced.
        drop(
            self.out
                .into_inner()
                .map_err(io::IntoInnerError::into_error)?,
        );

        self.index.sort_unstable_by_key(|entry| entry.0);
        let idx = encode_index(&self.index, &checksum);
        let name = format!("pack-{}", hex::encode(checksum));
        let pack = self.dir.join(format!("{name}.pack"));
        let tmp_idx = self.dir.join("tmp_idx_projection");
        fs::write(&tmp_idx, idx)?;
        fs::rename(&self.tmp_pack, &pack)?;
        fs::rename(&tmp_idx, self.dir.join(format!("{name}.idx")))?;
        Ok(pack)
    }
}

/// The version 2 index of `sorted` (ID, offset, CRC) entries of the pack with `checksum`.
fn encode_index(sorted: &[(Oid, u64, u32)], checksum: &[u8; 20]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 1024 + sorted.len() * 28 + 40);
    out.extend_from_slice(&[0xff, b't', b'O', b'c']);
    out.extend_from_slice(&2u32.to_be_bytes());
    let mut fanout = [0u32; 256];
    for (id, _, _) in sorted {
        fanout[usize::from(id.as_bytes()[0])] += 1;
    }
    let mut total = 0u32;
    for count in fanout {
        total += count;
        out.extend_from_slice(&total.to_be_bytes());
    }
    for (id, _, _) in sorted {
        out.extend_from_slice(id.as_bytes());
    }
    for (_, _, crc) in sorted {
        out.extend_from_slice(&crc.to_be_bytes());
    }
    let mut large = Vec::new();
    for (_, offset, _) in sorted {
        if *offset < 0x8000_0000 {
            out.extend_from_slice(&(*offset as u32).to_be_bytes());
        } else {
            let slot = 0x8000_0000 | large.len() as u32;
            out.extend_from_slice(&slot.to_be_bytes());
            large.push(*offset);
        }
    }
    for offset in large {
        out.extend_from_slice(&offset.to_be_bytes());
    }
    out.extend_from_slice(checksum);
    let own: [u8; 20] = Sha1::digest(&out).into();
    out.extend_from_slice(&own);
    out
}

#[cfg(test)]
mod tests {
    use git2::{ObjectType, Repository};

    use super::*;

    #[test]
    fn crc32_matches_the_check_value() {
        assert_eq!(crc32(0, b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(0, b""), 0);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 256) as u8).collect();
        let split = crc32(crc32(0, &data[..333]), &data[333..]);
        assert_eq!(split, crc32(0, &data));
    }

    #[test]
    fn index_uses_the_large_offset_table_past_two_gib() {
        let a = Oid::from_str("01").unwrap();
        let b = Oid::from_str("02").unwrap();
        let idx = encode_index(&[(a, 12, 7), (b, 0x1_0000_0000, 9)], &[0; 20]);
        let offsets = 8 + 1024 + 2 * 20 + 2 * 4;
        assert_eq!(&idx[offsets..offsets + 4], &12u32.to_be_bytes());
        assert_eq!(
            &idx[offsets + 4..offsets + 8],
            &0x8000_0000u32.to_be_bytes()
        );
        assert_eq!(
            &idx[offsets + 8..offsets + 16],
            &0x1_0000_0000u64.to_be_bytes()
        );
    }

    #[test]
    fn git2_reads_every_object_of_a_written_pack() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let contents: Vec<Vec<u8>> = [0usize, 1, 15, 16, 2047, 65_535, 65_536, 300_000]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 % 251) as u8).collect())
            .collect();
        let pack_dir = dir.path().join("objects/pack");
        let mut writer = PackWriter::create(&pack_dir, contents.len() as u32).unwrap();
        for content in &contents {
            let id = Oid::hash_object(ObjectType::Blob, content).unwrap();
            assert!(
                writer
                    .append(&encode_entry(id, ObjectKind::Blob, content))
                    .unwrap()
            );
        }
        let first = Oid::hash_object(ObjectType::Blob, &contents[0]).unwrap();
        assert!(
            !writer
                .append(&encode_entry(first, ObjectKind::Blob, &contents[0]))
                .unwrap()
        );
        let pack = writer.finish().unwrap();
        assert!(pack.exists() && pack.with_extension("idx").exists());
        assert_eq!(fs::read_dir(&pack_dir).unwrap().count(), 2, "no temp files");
        for content in &contents {
            let id = Oid::hash_object(ObjectType::Blob, content).unwrap();
            assert_eq!(repo.find_blob(id).unwrap().content(), content.as_slice());
        }
    }

    #[test]
    fn an_entry_written_in_pieces_is_the_entry_encoded_at_once() {
        let dir = tempfile::TempDir::new().unwrap();
        let contents: Vec<Vec<u8>> = [0usize, 15, 16, 65_535, 65_536, 300_000]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 % 251) as u8).collect())
            .collect();
        let at_once = dir.path().join("at-once");
        let mut writer = PackWriter::create(&at_once, contents.len() as u32).unwrap();
        for content in &contents {
            let id = Oid::hash_object(ObjectType::Blob, content).unwrap();
            writer
                .append(&encode_entry(id, ObjectKind::Blob, content))
                .unwrap();
        }
        let expected = fs::read(writer.finish().unwrap()).unwrap();
        let pieces = dir.path().join("pieces");
        let mut writer = PackWriter::create(&pieces, contents.len() as u32).unwrap();
        for (n, content) in contents.iter().enumerate() {
            let id = Oid::hash_object(ObjectType::Blob, content).unwrap();
            let mut entry = writer
                .begin(id, ObjectKind::Blob, content.len() as u64)
                .unwrap()
                .unwrap();
            // Pieces of uneven sizes, or the whole content at once.
            let piece = if n % 2 == 0 {
                1000 + n
            } else {
                content.len().max(1)
            };
            for piece in content.chunks(piece) {
                entry.write(piece).unwrap();
            }
            entry.finish().unwrap();
            assert!(writer.contains(id));
            assert!(writer.begin(id, ObjectKind::Blob, 1).unwrap().is_none());
        }
        let written = writer.finish().unwrap();
        assert!(fs::read(&written).unwrap() == expected, "pack bytes differ");
        assert_eq!(
            written.file_name(),
            fs::read_dir(&at_once)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.extension().is_some_and(|e| e == "pack"))
                .unwrap()
                .file_name()
        );
    }

    #[test]
    fn an_entry_of_the_wrong_size_or_left_unfinished_breaks_the_pack() {
        let dir = tempfile::TempDir::new().unwrap();
        let id = Oid::hash_object(ObjectType::Blob, b"abc").unwrap();
        let other = Oid::hash_object(ObjectType::Blob, b"other").unwrap();

        let mut writer = PackWriter::create(&dir.path().join("short"), 2).unwrap();
        let mut entry = writer.begin(id, ObjectKind::Blob, 3).unwrap().unwrap();
        entry.write(b"ab").unwrap();
        assert!(entry.finish().is_err(), "fewer bytes than announced");
        let error = writer
            .append(&encode_entry(other, ObjectKind::Blob, b"other"))
            .unwrap_err();
        assert!(error.to_string().contains("unfinished"), "{error}");
        assert!(writer.finish().is_err());

        let mut writer = PackWriter::create(&dir.path().join("long"), 1).unwrap();
        let mut entry = writer.begin(id, ObjectKind::Blob, 3).unwrap().unwrap();
        assert!(entry.write(b"abcd").is_err(), "more bytes than announced");
        // The entry is abandoned here.
        assert!(!writer.contains(id));
        assert!(writer.finish().is_err());

        let mut writer = PackWriter::create(&dir.path().join("dropped"), 1).unwrap();
        writer.begin(id, ObjectKind::Blob, 3).unwrap().unwrap();
        assert!(writer.begin(other, ObjectKind::Blob, 5).is_err());
        let error = writer.finish().unwrap_err();
        assert!(error.to_string().contains("unfinished"), "{error}");
    }

    #[test]
    fn a_pack_short_of_its_announced_count_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let writer = PackWriter::create(dir.path(), 2).unwrap();
        assert!(writer.finish().is_err());
    }
}
