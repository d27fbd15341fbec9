//! Writing loose Git objects with *stored* (level 0) deflate.
//!
//! Projections are ephemeral, and zlib compression was most of an export's time, so the
//! projector writes blobs as zlib streams made of stored blocks: a valid loose object for
//! every Git implementation, as large as the content. The encoding is pure; only
//! [`write_loose_blob`] touches the filesystem.

use std::{
    fs,
    io::{self, Write},
    path::Path,
};

/// Largest payload of one stored deflate block.
const STORED_BLOCK: usize = 65_535;

/// Adler-32 (RFC 1950) of the concatenation of `parts` (SIMD where the CPU has it).
fn adler32(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(1, |adler, part| zlib_rs::adler32::adler32(adler, part))
}

/// Writes the zlib stream (stored blocks only) of the concatenation of `parts` to `out`.
pub(crate) fn write_stored_zlib(out: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let blocks = total.div_ceil(STORED_BLOCK).max(1);
    out.write_all(&[0x78, 0x01])?;
    let mut remaining = total;
    let mut sources: Vec<&[u8]> = parts.to_vec();
    let mut source = 0;
    for block in 0..blocks {
        let len = remaining.min(STORED_BLOCK);
        remaining -= len;
        let len16 = u16::try_from(len).unwrap_or(u16::MAX);
        out.write_all(&[u8::from(block + 1 == blocks)])?;
        out.write_all(&len16.to_le_bytes())?;
        out.write_all(&(!len16).to_le_bytes())?;
        let mut need = len;
        while need > 0 {
            while sources[source].is_empty() {
                source += 1;
            }
            let take = need.min(sources[source].len());
            out.write_all(&sources[source][..take])?;
            sources[source] = &sources[source][take..];
            need -= take;
        }
    }
    out.write_all(&adler32(parts).to_be_bytes())
}

/// The bytes of a loose object file for a blob: zlib(stored) of `"blob <len>\0" ‖ content`.
pub fn encode_loose_blob(content: &[u8]) -> Vec<u8> {
    let header = format!("blob {}\0", content.len());
    let mut out = Vec::with_capacity(header.len() + content.len() + 64);
    // Writing into a Vec cannot fail.
    let _ = write_stored_zlib(&mut out, &[header.as_bytes(), content]);
    out
}

/// Writes `content` as loose blob `id_hex` under `objects_dir` (`objects/xx/yyyy…`), streaming
/// the stored-deflate encoding (no second copy of the content in memory). The caller vouches
/// that `id_hex` is the blob's ID.
pub fn write_loose_blob(objects_dir: &Path, id_hex: &str, content: &[u8]) -> io::Result<()> {
    let (dir, file) = id_hex.split_at(2.min(id_hex.len()));
    let dir = objects_dir.join(dir);
    fs::create_dir_all(&dir)?;
    let header = format!("blob {}\0", content.len());
    let mut out = io::BufWriter::with_capacity(1 << 16, fs::File::create(dir.join(file))?);
    write_stored_zlib(&mut out, &[header.as_bytes(), content])?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adler32_matches_the_rfc_example() {
        assert_eq!(adler32(&[b"Wikipedia"]), 0x11E6_0398);
        assert_eq!(adler32(&[b"Wiki", b"pedia"]), 0x11E6_0398);
        assert_eq!(adler32(&[]), 1);
    }

    #[test]
    fn git_reads_stored_loose_objects_of_every_size() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        for size in [0usize, 1, 65_520, 65_535, 65_536, 200_000] {
            let content: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let id = git2::Oid::hash_object(git2::ObjectType::Blob, &content).unwrap();
            let objects = dir.path().join("objects");
            let hex_id = id.to_string();
            write_loose_blob(&objects, &hex_id, &content).unwrap();
            let written = std::fs::read(objects.join(&hex_id[..2]).join(&hex_id[2..])).unwrap();
            assert_eq!(written, encode_loose_blob(&content), "size {size}");
            let blob = repo.find_blob(id).unwrap();
            assert_eq!(blob.content(), content.as_slice(), "size {size}");
        }
    }
}
